// What stands in for a part a build leaves out (CMakeLists.txt, NM_WITH_*):
// src/off/<part>.c defines that part's public calls, each failing with
// NM_ERR_UNSUPPORTED and a message naming the CMake option that brings it,
// so the header and the library's exports stay the same in every build.
#ifndef NM_OFF_H
#define NM_OFF_H

#include "core/fail.h"

// "<what> is not in this build of nanomind (configure with -D<option>=ON)"
#define NM_OFF_MSG(what, option) what " is not in this build of nanomind (configure with -D" option "=ON)"
#define nm_off_fail(err, err_size, what, option) nm_fail(NM_ERR_UNSUPPORTED, err, err_size, "%s", NM_OFF_MSG(what, option))

#endif
