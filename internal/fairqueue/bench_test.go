package fairqueue

import (
	"container/heap"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// benchQueue returns a queue holding jobs jobs spread evenly over tenants
// tenants, each job costing one quantum and expiring in an hour, and the
// tenant names.
func benchQueue(b *testing.B, tenants, jobs int) (*Queue, []string) {
	q := New(Config{Quantum: 1000})
	names := make([]string, tenants)
	for i := range names {
		names[i] = "tenant-" + strconv.Itoa(i)
		q.SetTenant(names[i], 1, -1) // as the scheduler configures every TenantQuota
	}
	deadline := now0.Add(time.Hour)
	for i := range jobs {
		j := &Job{ID: "job-" + strconv.Itoa(i), Tenant: names[i%tenants], Cost: 1000, Deadline: deadline}
		if err := q.Enqueue(now0, j); err != nil {
			b.Fatal(err)
		}
	}
	return q, names
}

// benchEnqueueDequeue measures one Dequeue plus one Enqueue at a steady queue
// size: the dequeued job is recycled as a new job of a tenant picked by a
// stride through all tenants (arrivals are not correlated with dispatches).
// 2*jobs operations run untimed first, so that the rings and deadline
// tickets have reached their steady-state sizes (the benchmark method's
// "steady state"); their growth before that is amortised slice growth.
// Target: 0 allocs/op, and 1M jobs at most 1.5x the cost at 10k (brief
// "Performance targets").
func benchEnqueueDequeue(b *testing.B, tenants, jobs int, eligible func(string, *Job) bool) {
	q, names := benchQueue(b, tenants, jobs)
	b.ReportAllocs()
	next := 0
	op := func() {
		j, _ := q.Dequeue(now0, eligible)
		next += 7919
		if next >= tenants {
			next %= tenants
		}
		if eligible != nil {
			next &^= 1 // new work goes to eligible (even) tenants only
		}
		if j == nil {
			b.Fatal("nothing eligible")
		}
		j.Tenant = names[next]
		if err := q.Enqueue(now0, j); err != nil {
			b.Fatal(err)
		}
	}
	steadyLoop(b, jobs, op)
	if tenants == 100_000 && eligible == nil {
		reportVsHeap(b)
	}
}

// steadyLoop runs op 2*jobs times untimed (the rings and deadline tickets
// reach their steady-state sizes), collects the garbage of that warm-up, and
// only then times op with b.Loop, whose first call starts the timer: neither
// the warm-up nor its collection is in ns/op.
func steadyLoop(b *testing.B, jobs int, op func()) {
	for range 2 * jobs {
		op()
	}
	runtime.GC()
	for b.Loop() {
		op()
	}
}

// benchEnqueueDequeueRef is benchEnqueueDequeue with the new job's tenant
// given by a TenantRef (EnqueueTo) instead of by name.
func benchEnqueueDequeueRef(b *testing.B, tenants, jobs int) {
	q, refs := benchQueueRefs(b, tenants, jobs)
	b.ReportAllocs()
	next := 0
	op := func() {
		j, _ := q.Dequeue(now0, nil)
		next += 7919
		if next >= tenants {
			next %= tenants
		}
		if j == nil {
			b.Fatal("empty")
		}
		if err := q.EnqueueTo(now0, refs[next], j); err != nil {
			b.Fatal(err)
		}
	}
	steadyLoop(b, jobs, op)
	if tenants == 100_000 {
		reportVsHeap(b)
	}
}

// benchQueueRefs is benchQueue with a TenantRef per tenant.
func benchQueueRefs(b *testing.B, tenants, jobs int) (*Queue, []TenantRef) {
	q, names := benchQueue(b, tenants, jobs)
	refs := make([]TenantRef, tenants)
	for i, n := range names {
		refs[i] = q.Tenant(n)
	}
	return q, refs
}

// benchSameJob measures one Dequeue plus one Enqueue at a steady queue size
// in the benchmark method's workload ("steady state is one dequeue followed
// by re-enqueue of the same job, so 1M jobs stay queued"): the dequeued job
// goes back to the tail of its own tenant's queue, by TenantRef (EnqueueTo,
// the handle kept with the job as the gateway keeps it with the tenant) or
// by name (Enqueue). Warm-up and targets as benchEnqueueDequeue.
func benchSameJob(b *testing.B, tenants, jobs int, byRef bool) {
	q, refs := benchQueueRefs(b, tenants, jobs)
	for t := q.cur; t != nil; {
		for s := t.head; s != t.tail; s++ {
			if j := t.ring[s&t.mask()]; j != nil {
				j.Value = &refs[tenantIndex(b, j.Tenant)]
			}
		}
		if t = t.next; t == q.cur {
			break
		}
	}
	b.ReportAllocs()
	op := func() {
		j, _ := q.Dequeue(now0, nil)
		if j == nil {
			b.Fatal("empty")
		}
		var err error
		if byRef {
			err = q.EnqueueTo(now0, *j.Value.(*TenantRef), j)
		} else {
			err = q.Enqueue(now0, j)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	steadyLoop(b, jobs, op)
	if tenants == 100_000 {
		reportVsHeap(b)
	}
}

// tenantIndex returns i of the bench tenant named "tenant-i".
func tenantIndex(b *testing.B, name string) int {
	i, err := strconv.Atoi(strings.TrimPrefix(name, "tenant-"))
	if err != nil {
		b.Fatal(err)
	}
	return i
}

// BenchmarkEnqueueDequeue runs, in one run: the container/heap peer of the
// benchmark method (impl=container-heap, container/heap of int64, Pop then
// Push, 1M items); this queue with the new job's tenant given by TenantRef
// (impl=drr-ref, EnqueueTo, as the gateway enqueues) and by name (impl=drr,
// Enqueue); and a weighted fair queue built on container/heap
// (impl=heap-wfq, see heapWFQ). Two workloads: the benchmark method's
// (workload=same-job: the dequeued job goes back to its own tenant,
// benchSameJob) and a harder one (no workload element: it goes to a tenant
// picked by a stride through all of them, benchEnqueueDequeue, so arrivals
// are not correlated with dispatches and every enqueue touches a cold
// tenant). At 100k tenants the drr rows report heap/drr, the container/heap
// peer's ns/op over theirs. The brief's targets: heap/drr at least 3 at 100k
// tenants and 1M jobs, 0 allocs/op, and drr at 1M jobs at most 1.5x drr at
// 10k jobs.
func BenchmarkEnqueueDequeue(b *testing.B) {
	b.Run("tenants=100k/jobs=1M/impl=container-heap", benchContainerHeap)
	for _, size := range []struct {
		name          string
		tenants, jobs int
	}{
		{"tenants=100k/jobs=1M", 100_000, 1_000_000},
		{"tenants=1k/jobs=10k", 1_000, 10_000},
		{"tenants=10/jobs=10k", 10, 10_000},
	} {
		b.Run(size.name+"/workload=same-job/impl=drr-ref", func(b *testing.B) { benchSameJob(b, size.tenants, size.jobs, true) })
		b.Run(size.name+"/workload=same-job/impl=drr", func(b *testing.B) { benchSameJob(b, size.tenants, size.jobs, false) })
		b.Run(size.name+"/impl=drr-ref", func(b *testing.B) { benchEnqueueDequeueRef(b, size.tenants, size.jobs) })
		b.Run(size.name+"/impl=drr", func(b *testing.B) { benchEnqueueDequeue(b, size.tenants, size.jobs, nil) })
		b.Run(size.name+"/impl=heap-wfq", func(b *testing.B) { benchHeapWFQ(b, size.tenants, size.jobs) })
	}
}

// heapWFQ is the container/heap peer of the benchmark: self-clocked weighted
// fair queueing (S. J. Golestani, INFOCOM 1994) with one heap entry per
// queued job keyed by its virtual finish tag, start = max(virtual time,
// tenant's last finish), finish = start + cost*1024/weight. It does the same
// scheduling job as DRR by weighted cost but keeps no ID index and no
// deadline index, so it does less work per job than Queue.
type heapWFQ struct {
	tenants map[string]*wfqTenant
	h       wfqHeap
	vtime   int64
	free    []*wfqItem
}

type wfqTenant struct {
	weight, lastFinish int64
}

type wfqItem struct {
	job    *Job
	finish int64
	seq    uint64
	index  int
}

type wfqHeap []*wfqItem

func (h wfqHeap) Len() int { return len(h) }
func (h wfqHeap) Less(i, j int) bool {
	return h[i].finish < h[j].finish || h[i].finish == h[j].finish && h[i].seq < h[j].seq
}
func (h wfqHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i]; h[i].index = i; h[j].index = j }
func (h *wfqHeap) Push(x any)   { it := x.(*wfqItem); it.index = len(*h); *h = append(*h, it) }
func (h *wfqHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return it
}

var wfqSeq uint64

func (w *heapWFQ) enqueue(j *Job) {
	t := w.tenants[j.Tenant]
	if t == nil {
		t = &wfqTenant{weight: 1}
		w.tenants[j.Tenant] = t
	}
	var it *wfqItem
	if n := len(w.free); n > 0 {
		it, w.free = w.free[n-1], w.free[:n-1]
	} else {
		it = &wfqItem{}
	}
	start := max(w.vtime, t.lastFinish)
	t.lastFinish = start + j.Cost*1024/t.weight
	wfqSeq++
	it.job, it.finish, it.seq = j, t.lastFinish, wfqSeq
	heap.Push(&w.h, it)
}

func (w *heapWFQ) dequeue() *Job {
	if len(w.h) == 0 {
		return nil
	}
	it := heap.Pop(&w.h).(*wfqItem)
	w.vtime = it.finish
	j := it.job
	it.job = nil
	w.free = append(w.free, it)
	return j
}

func benchHeapWFQ(b *testing.B, tenants, jobs int) {
	w := &heapWFQ{tenants: make(map[string]*wfqTenant)}
	names := make([]string, tenants)
	for i := range names {
		names[i] = "tenant-" + strconv.Itoa(i)
	}
	deadline := now0.Add(time.Hour)
	for i := range jobs {
		w.enqueue(&Job{ID: "job-" + strconv.Itoa(i), Tenant: names[i%tenants], Cost: 1000, Deadline: deadline})
	}
	b.ReportAllocs()
	next := 0
	for b.Loop() {
		j := w.dequeue()
		next += 7919
		if next >= tenants {
			next %= tenants
		}
		j.Tenant = names[next]
		w.enqueue(j)
	}
}

// BenchmarkEnqueueDequeueEligible adds an eligibility predicate that refuses
// every other tenant, as a loaded limiter would: each dispatch passes over an
// ineligible tenant.
func BenchmarkEnqueueDequeueEligible(b *testing.B) {
	benchEnqueueDequeue(b, 100_000, 1_000_000, func(tenant string, _ *Job) bool { return tenant[len(tenant)-1]%2 == 0 })
}

// int64Heap is container/heap's IntHeap example with int64 elements: the
// peer defined in the benchmark method ("Heap: container/heap of int64 with
// Pop then Push").
type int64Heap []int64

func (h int64Heap) Len() int           { return len(h) }
func (h int64Heap) Less(i, j int) bool { return h[i] < h[j] }
func (h int64Heap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *int64Heap) Push(x any)        { *h = append(*h, x.(int64)) }
func (h *int64Heap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// BenchmarkContainerHeap is the baseline of the brief's speed target (the
// fair queue at least 3x faster at 100k tenants and 1M jobs): container/heap
// of int64, Pop then Push of a key larger than every key queued (a virtual
// finish time), 1M items, as in the benchmark method.
// BenchmarkEnqueueDequeue/tenants=100k/jobs=1M/impl=container-heap is the
// same measurement, run first so that the fair queue's sub-benchmarks after
// it report the ratio (heap/drr) in the same run.
func BenchmarkContainerHeap(b *testing.B) { benchContainerHeap(b) }

// heapNs and heapN sum the time and operations of the container/heap peer
// measured so far in this process; the fair queue's benchmarks at 100k
// tenants and 1M jobs report heap/drr against their ratio.
var heapNs, heapN float64

func benchContainerHeap(b *testing.B) {
	h := newInt64Heap()
	runtime.GC() // as for the queue: no garbage of the setup collected on the clock
	b.ReportAllocs()
	for b.Loop() {
		h.popPush()
	}
	heapNs += float64(b.Elapsed().Nanoseconds())
	heapN += float64(b.N)
}

// reportVsHeap reports the container/heap peer's mean ns/op in this run
// over this benchmark's ns/op as heap/drr (the speed-up; target at least 3).
func reportVsHeap(b *testing.B) {
	if heapN > 0 && b.N > 0 {
		b.ReportMetric(heapNs/heapN/(float64(b.Elapsed().Nanoseconds())/float64(b.N)), "heap/drr")
	}
}

type heapPeer struct {
	h  int64Heap
	vt int64
}

const heapPeerItems = 1_000_000

func newInt64Heap() *heapPeer {
	p := &heapPeer{h: make(int64Heap, 0, heapPeerItems+1), vt: heapPeerItems}
	for i := range heapPeerItems {
		p.h = append(p.h, int64(i)*7919%heapPeerItems)
	}
	heap.Init(&p.h)
	return p
}

func (p *heapPeer) popPush() {
	vt := heap.Pop(&p.h).(int64)
	p.vt = max(p.vt, vt) + 1
	heap.Push(&p.h, p.vt)
}

// BenchmarkMemoryPerJob reports the queue's memory per queued job beyond the
// Job struct itself (index entry, deadline index, tenant state) as B/job,
// that plus the queue's links inside Job (jobLinkBytes) as
// B/job-incl-links, and the whole Job struct, measured with 1M jobs over
// 100k tenants (brief target: at most 64 bytes per job excluding the body).
func BenchmarkMemoryPerJob(b *testing.B) {
	const tenants, n = 100_000, 1_000_000
	for b.Loop() {
		jobs := make([]*Job, n)
		deadline := now0.Add(time.Hour)
		for i := range jobs {
			jobs[i] = &Job{ID: "job-" + strconv.Itoa(i), Tenant: "tenant-" + strconv.Itoa(i%tenants), Cost: 1000, Deadline: deadline}
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		q := New(Config{Quantum: 1000})
		for _, j := range jobs {
			if err := q.Enqueue(now0, j); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		ext := float64(after.HeapAlloc-before.HeapAlloc) / n
		b.ReportMetric(ext, "B/job")
		b.ReportMetric(ext+float64(jobLinkBytes), "B/job-incl-links")
		b.ReportMetric(float64(unsafeSizeofJob), "B/Job-struct")
		runtime.KeepAlive(q)
		runtime.KeepAlive(jobs)
	}
}
