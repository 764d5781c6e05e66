// Output files that never damage what is already on disk. Every writer of
// nanomind (WAV, GGUF, transcripts, the generators) goes through these.
//
//   "-"                 stdout, written in place.
//   a regular file, or  a temporary file beside it (same folder, so the rename
//   a path that does    is atomic), renamed over the path on commit; until
//   not exist yet       then the old file is untouched, and a failure removes
//                       only the temporary. An existing file keeps its mode;
//                       a symlink is followed (its target is replaced, the
//                       link kept). A file we may not write is refused
//                       (EACCES), as `>` would, though the folder's write
//                       permission would let the rename replace it.
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

typedef struct nm_outfile {
    FILE *f;         // write here between open and commit
    char *path;      // as given (for messages)
    char *final;     // what commit renames onto; NULL when written in place
    char *tmp;       // the temporary file; NULL when written in place
    bool seekable;   // f can seek (the temporary file): a header can be rewritten
    bool is_stdout;
} nm_outfile;

nm_status nm_outfile_open(nm_outfile *o, const char *path, char *err, size_t err_size);
// Flushes (and syncs a temporary file), closes, renames. On failure the
// temporary is removed and the old file, if any, is as it was.
nm_status nm_outfile_commit(nm_outfile *o, char *err, size_t err_size);
// Closes and removes the temporary (a no-op after commit or on a zeroed o).
void nm_outfile_abort(nm_outfile *o);

#endif
