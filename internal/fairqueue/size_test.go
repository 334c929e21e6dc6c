package fairqueue

import "unsafe"

// unsafeSizeofJob is the size of Job including the queue's own fields.
const unsafeSizeofJob = unsafe.Sizeof(Job{})

// jobLinkBytes is the part of Job that belongs to the queue rather than to
// the caller's record: ring position, deadline slot, bypass counter, queued
// flag and padding (from the field pos to the end of the struct).
const jobLinkBytes = unsafe.Sizeof(Job{}) - unsafe.Offsetof(Job{}.pos)
