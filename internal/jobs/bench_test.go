package jobs

import (
	"fmt"
	"testing"

	clocktesting "k8s.io/utils/clock/testing"
)

// BenchmarkFinishAtBound measures one job created finished (as a finish
// does) in a MemStore at its bound of DefaultMaxFinished finished jobs, so
// each op also prunes one finished job by the bound's rule. The jobs are
// held by 100,000 tenants (one each) or, as a peer, by 1,000 (100 each):
// "spread", each tenant finishing in turn (all hold as many: the pool's
// oldest goes), and "import", one tenant finishing while the others hold
// their jobs (the importing tenant's oldest goes). A scan over tenants per
// prune would make the 100,000-tenant cases about 100 times the 1,000-tenant
// ones; ns/op and allocs/op are reported, nothing is asserted.
func BenchmarkFinishAtBound(b *testing.B) {
	for _, tenants := range []int{1000, 100000} {
		names := make([]string, tenants)
		for i := range names {
			names[i] = fmt.Sprintf("tenant-%06d", i)
		}
		for _, bc := range []struct {
			name   string
			tenant func(i int) string
		}{
			{"spread", func(i int) string { return names[i%tenants] }},
			{"import", func(int) string { return names[0] }},
		} {
			b.Run(fmt.Sprintf("%s/tenants=%d", bc.name, tenants), func(b *testing.B) {
				fc := clocktesting.NewFakeClock(t0)
				s := NewMemStore(fc, 0, DefaultMaxFinished)
				for i := range DefaultMaxFinished {
					if _, err := s.Create(Job{Tenant: names[i%tenants], Status: StatusSucceeded, FinishedAt: t0}); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					if _, err := s.Create(Job{Tenant: bc.tenant(i), Status: StatusSucceeded, FinishedAt: t0}); err != nil {
						b.Fatal(err)
					}
					i++
				}
				b.StopTimer()
				if got := s.Counts()[StatusSucceeded]; got != DefaultMaxFinished {
					b.Fatalf("%d finished jobs held, want %d", got, DefaultMaxFinished)
				}
			})
		}
	}
}
