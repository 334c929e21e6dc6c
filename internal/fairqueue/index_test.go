package fairqueue

import (
	"hash/maphash"
	"math/rand/v2"
	"strconv"
	"testing"
)

// TestIDIndexMatchesMap checks the open-addressing index against a Go map
// over random inserts and removals that grow and shrink the table (probe runs
// wrap around the end of the table and backward shifts cross it).
func TestIDIndexMatchesMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	x := idIndex{seed: maphash.MakeSeed()}
	model := map[string]*Job{}
	var live []*Job
	for step := range 200_000 {
		grow := step < 100_000 && rng.IntN(3) != 0 || step >= 100_000 && rng.IntN(3) == 0
		if grow || len(live) == 0 {
			j := &Job{ID: "id-" + strconv.Itoa(step)}
			x.insert(j)
			model[j.ID] = j
			live = append(live, j)
		} else {
			i := rng.IntN(len(live))
			j := live[i]
			live[i] = live[len(live)-1]
			live = live[:len(live)-1]
			x.remove(j)
			delete(model, j.ID)
		}
		if x.len() != len(model) {
			t.Fatalf("step %d: len %d, model %d", step, x.len(), len(model))
		}
		if step%997 == 0 {
			for id, j := range model {
				if x.get(id) != j {
					t.Fatalf("step %d: get(%s) lost", step, id)
				}
			}
			if x.get("absent") != nil {
				t.Fatal("found an absent ID")
			}
			if n := len(x.slots); n > minIndexSlots && x.n*4 > n*3 {
				t.Fatalf("load %d/%d above 3/4", x.n, n)
			}
		}
	}
	if len(x.slots) > 1024 && x.n*8 < len(x.slots) {
		t.Errorf("table of %d slots for %d jobs did not shrink", len(x.slots), x.n)
	}
}
