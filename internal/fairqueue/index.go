package fairqueue

import "hash/maphash"

// idIndex maps job IDs to queued jobs: an open-addressing hash table with
// linear probing and backward-shift deletion (Knuth, TAOCP vol. 3, 6.4,
// Algorithm R). A slot is 16 bytes (the ID's hash and the job), the load
// stays between 1/8 and 3/4, and a removal compares pointers, never IDs, so
// it touches no string data. It replaces a map[string]*Job, which costs about
// three times the memory per job and rehashes under steady churn.
type idIndex struct {
	seed  maphash.Seed
	slots []idSlot // length a power of two, or nil
	n     int
}

type idSlot struct {
	h uint64
	j *Job // nil: empty
}

const minIndexSlots = 16

func (x *idIndex) hash(id string) uint64 { return maphash.String(x.seed, id) }

func (x *idIndex) len() int { return x.n }

// get returns the job with the given ID, or nil.
func (x *idIndex) get(id string) *Job {
	if x.n == 0 {
		return nil
	}
	h := x.hash(id)
	mask := uint64(len(x.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		s := &x.slots[i]
		if s.j == nil {
			return nil
		}
		if s.h == h && s.j.ID == id {
			return s.j
		}
	}
}

// insert adds j, whose ID must not be in the index.
func (x *idIndex) insert(j *Job) {
	if (x.n+1)*4 > len(x.slots)*3 {
		x.resize(max(minIndexSlots, 2*len(x.slots)))
	}
	x.put(x.hash(j.ID), j)
	x.n++
}

func (x *idIndex) put(h uint64, j *Job) {
	mask := uint64(len(x.slots) - 1)
	i := h & mask
	for x.slots[i].j != nil {
		i = (i + 1) & mask
	}
	x.slots[i] = idSlot{h: h, j: j}
}

// remove deletes j, which must be in the index.
func (x *idIndex) remove(j *Job) {
	h := x.hash(j.ID)
	mask := uint64(len(x.slots) - 1)
	i := h & mask
	for x.slots[i].j != j {
		i = (i + 1) & mask
	}
	// Backward shift: move later entries of the probe run into the hole
	// unless their home slot lies cyclically in (hole, entry].
	for k := (i + 1) & mask; x.slots[k].j != nil; k = (k + 1) & mask {
		home := x.slots[k].h & mask
		if i <= k {
			if i < home && home <= k {
				continue
			}
		} else if i < home || home <= k {
			continue
		}
		x.slots[i] = x.slots[k]
		i = k
	}
	x.slots[i] = idSlot{}
	x.n--
	if len(x.slots) > 1024 && x.n*8 < len(x.slots) {
		x.resize(len(x.slots) / 2)
	}
}

func (x *idIndex) resize(size int) {
	old := x.slots
	x.slots = make([]idSlot, size)
	for _, s := range old {
		if s.j != nil {
			x.put(s.h, s.j)
		}
	}
}
