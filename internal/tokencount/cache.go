package tokencount

import (
	"encoding/binary"
	"hash/maphash"
	"sync/atomic"
)

// Cache remembers the token counts of recently counted texts, so that a
// text sent again is tokenized once: chat clients resend the system prompt
// and every earlier turn of a conversation with each request, so without
// it the prompt of a conversation's n-th turn costs tokenizing all n turns
// again (quadratic in the conversation's length), and tokenizing is the
// largest part of the gateway's own CPU per small request (regexp2
// pre-tokenizer: about 5 µs and 57 allocations for ten words).
//
// Counts are kept per scope (the gateway uses the tenant id): a tenant
// never hits a text another tenant sent, so the time of a request tells it
// nothing of other tenants' prompts (the timing side channel of shared
// prompt caches).
//
// It is a direct-mapped table of slots (a power of two), each one atomic
// word holding a 40-bit tag of the text's seeded 64-bit hash (maphash, a
// random seed per process) and a 24-bit count: lookups and stores take no
// lock and allocate nothing, a new text evicts the one in its slot, and
// memory is 8 bytes per slot. A text whose count does not fit in 24 bits
// (16,777,215 tokens) is not kept. Two texts are confused only when their
// hashes agree in the slot index and the tag (probability 2^-(39+log2
// slots) per lookup); the gateway's estimate is corrected by the
// provider's usage in any case (brief "cost model").
type Cache struct {
	seed  maphash.Seed
	slots []atomic.Uint64
	// count tokenizes a text on a miss (Text; tests inject their own).
	count func(string) (int64, error)
}

const (
	countBits = 24
	countMask = 1<<countBits - 1
)

// DefaultCacheSlots is the number of slots of the gateway's cache: 65,536
// texts in 512 KiB. A text stays until another one lands in its slot, so an
// entry lives for about DefaultCacheSlots new texts: at 500 requests a
// second bringing one or two new texts each, about a minute, the time a
// user takes to write the next turn of a conversation (8,192 slots kept a
// text about 10 s). The pages of slots never written are not resident.
const DefaultCacheSlots = 1 << 16

// NewCache returns a Cache of slots slots (rounded up to a power of two,
// at least 1), counting misses with Text.
func NewCache(slots int) *Cache { return newCache(slots, Text) }

func newCache(slots int, count func(string) (int64, error)) *Cache {
	n := 1
	for n < slots {
		n <<= 1
	}
	return &Cache{seed: maphash.MakeSeed(), slots: make([]atomic.Uint64, n), count: count}
}

// Text returns the number of cl100k_base tokens in s, as Text does, from
// the cache when scope counted s recently. Errors are Text's (and are not
// cached).
func (c *Cache) Text(scope, s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	var h maphash.Hash
	h.SetSeed(c.seed)
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(scope)))
	_, _ = h.Write(n[:])
	_, _ = h.WriteString(scope)
	_, _ = h.WriteString(s)
	sum := h.Sum64()
	slot := &c.slots[sum&uint64(len(c.slots)-1)]
	// The tag is the hash's top 40 bits with the lowest forced to 1, so
	// that no kept entry is the empty slot's zero word.
	tag := (sum>>countBits | 1) << countBits
	if e := slot.Load(); e&^countMask == tag {
		return int64(e & countMask), nil
	}
	k, err := c.count(s)
	if err == nil && k <= countMask {
		slot.Store(tag | uint64(k))
	}
	return k, err
}
