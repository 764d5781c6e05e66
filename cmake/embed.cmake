# Writes OUT: the bytes of SRC as a C array NAME (NUL-terminated) and NAME_len,
# so the runtime carries its OpenCL kernels without reading files.
file(READ ${SRC} hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
file(WRITE ${OUT} "// Generated from ${SRC} by cmake/embed.cmake: do not edit.\n#include <stddef.h>\nconst unsigned char ${NAME}[] = {${bytes}0x00};\nconst size_t ${NAME}_len = sizeof ${NAME} - 1;\n")
