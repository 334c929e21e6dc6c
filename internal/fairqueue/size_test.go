package fairqueue

import "unsafe"

// unsafeSizeofJob is the size of Job including its queue links (32 bytes of
// list pointers and a bypass counter).
const unsafeSizeofJob = unsafe.Sizeof(Job{})

// jobLinkBytes is the part of Job that belongs to the queue rather than to
// the caller's record: the FIFO and deadline-list pointers, the bypass
// counter and padding (from the field prev to the end of the struct).
const jobLinkBytes = unsafe.Sizeof(Job{}) - unsafe.Offsetof(Job{}.prev)
