// Input files: the one way nanomind opens a file it reads on a caller's word
// (images, audio, prompt and key files, profiles, frames, models). The
// public calls (include/nanomind.h, "input files") and, here, the descriptor
// form for the readers that map or stream a file themselves (the GGUF and
// Whisper readers, libsndfile).
//
// The rules, in one place:
//   - the open never blocks: O_NONBLOCK, cleared once open (a FIFO with no
//     writer is not waited on: refused, or an empty stream);
//   - a folder is an error; anything but a regular file (a FIFO, a pipe, a
//     device, a socket) is refused unless the caller takes a stream: stdin
//     alone ("-", /dev/stdin: NM_INFILE_STDIN) or any (NM_INFILE_STREAM);
//   - a regular file over the caller's cap is refused from its size, before a
//     byte is read; a stream is read up to cap + 1 bytes and refused at that.
// Errors name the path, the cause and the cap.
#ifndef NM_IO_INFILE_H
#define NM_IO_INFILE_H

#include <stdint.h>

#include "nanomind.h"

// Opens path under the rules above. On success *fd is the caller's to close
// (for "-", a duplicate of descriptor 0), at offset 0 for a regular file; *size
// is the file's size, or -1 for a stream (whose reads the caller bounds).
nm_status nm_infile_fd(const char *path, uint64_t max_bytes, uint32_t flags, int *fd, int64_t *size, char *err,
                       size_t err_size);

#endif
