// Output files that never damage what is already on disk. Every writer of
// nanomind (WAV, GGUF, transcripts, the generators) goes through these.
//
//   "-", "/dev/stdout"  stdout, written in place.
//   a regular file, or  a temporary file beside it (same folder, so the rename
//   a path that does    is atomic), renamed over the path on commit; until
//   not exist yet       then the old file is untouched, and a failure removes
//                       only the temporary. An existing file keeps its mode;
//                       a symlink is followed (its target is replaced, the
//                       link kept). A file we may not write is refused
//                       (EACCES), as `>` would, though the folder's write
//                       permission would let the rename replace it. The
//                       temporary is .NAME.nm-PID-N.tmp; a signal handler
//                       removes the open ones (nm_outfile_remove_temps), and
//                       an open removes those of NAME whose PID is gone.
//   anything else       (a device, a FIFO, a socket) written in place, never
//                       truncated or removed; a FIFO without a reader is an
//                       error, not a hang.
//   a folder            an error.
// Errors name the path and the real cause (the errno of the call that failed).
#ifndef NM_CORE_OUTFILE_H
#define NM_CORE_OUTFILE_H

#include <stdbool.h>
#include <stdio.h>

#include "nanomind.h"

// nm_outfile and its calls are public (include/nanomind.h, "output files").

#endif
