package gateway

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

// TestReadAllLimitFollowsArrivedBytes: the request body buffer follows the
// bytes that arrive, not the announced Content-Length. A 10-byte body
// announced as 8 MiB gets a buffer of initialBodyBuffer (64 KiB), not
// 8 MiB; a body that arrives as announced ends in a buffer of exactly
// Content-Length+1 (no append slack); an unknown length starts at 512
// bytes; the bytes are always those sent, and a body over the limit is read
// to limit+1 bytes.
func TestReadAllLimitFollowsArrivedBytes(t *testing.T) {
	const limit = DefaultMaxBodyBytes
	b, err := readAllLimit(strings.NewReader(`{"a":1}xyz`), limit, limit)
	if err != nil || string(b) != `{"a":1}xyz` || cap(b) != initialBodyBuffer {
		t.Errorf("10 bytes announced as %d: %q cap %d err %v; want cap %d", int64(limit), b, cap(b), err, initialBodyBuffer)
	}
	for _, n := range []int{0, 100, initialBodyBuffer - 1, initialBodyBuffer, 200 << 10, 3 << 20} {
		body := bytes.Repeat([]byte("x"), n)
		b, err := readAllLimit(bytes.NewReader(body), int64(n), limit)
		if err != nil || !bytes.Equal(b, body) || cap(b) != n+1 {
			t.Errorf("%d bytes announced truthfully: len %d cap %d err %v; want cap %d", n, len(b), cap(b), err, n+1)
		}
	}
	b, err = readAllLimit(io.MultiReader(strings.NewReader("ab"), strings.NewReader("c")), -1, limit)
	if err != nil || string(b) != "abc" || cap(b) != 512 {
		t.Errorf("unknown length: %q cap %d err %v; want cap 512", b, cap(b), err)
	}
	b, err = readAllLimit(bytes.NewReader(bytes.Repeat([]byte("y"), 5000)), 5000, 1000)
	if err != nil || len(b) != 1001 {
		t.Errorf("over the limit: read %d bytes, err %v; want 1001", len(b), err)
	}
}
