# Writes OUT: the bytes of the files SRCS ('|'-separated, joined in that order)
# as a C array NAME (NUL-terminated) and NAME_len, so the runtime carries its
# OpenCL kernels (one program from several files) without reading files.
string(REPLACE "|" ";" srcs "${SRCS}")
set(hex "")
foreach(src ${srcs})
  file(READ ${src} part HEX)
  string(APPEND hex "${part}")
endforeach()
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
file(WRITE ${OUT} "// Generated from ${SRCS} by cmake/embed.cmake: do not edit.\n#include <stddef.h>\nconst unsigned char ${NAME}[] = {${bytes}0x00};\nconst size_t ${NAME}_len = sizeof ${NAME} - 1;\n")
