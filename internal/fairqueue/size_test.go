package fairqueue

import "unsafe"

// unsafeSizeofJob is the size of Job including its queue links (32 bytes of
// list pointers and a bypass counter).
const unsafeSizeofJob = unsafe.Sizeof(Job{})
