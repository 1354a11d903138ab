/* status.c - status codes and the thread-local last-error message. */
#include "status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define RM_STRINGIFY_(x) #x
#define RM_STRINGIFY(x) RM_STRINGIFY_(x)

static _Thread_local char last_error[1024];

rm_status rm_fail(rm_status status, const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
    return status;
}

void rm_clear_error(void) { last_error[0] = '\0'; }

const char * rm_last_error(void) { return last_error; }

uint32_t rm_abi_version(void) { return RM_ABI_VERSION; }

const char * rm_status_str(rm_status status) {
    switch (status) {
        case RM_OK:                 return "RM_OK";
        case RM_E_IO:               return "RM_E_IO";
        case RM_E_FORMAT:           return "RM_E_FORMAT";
        case RM_E_UNSUPPORTED_TYPE: return "RM_E_UNSUPPORTED_TYPE";
        case RM_E_UNSUPPORTED_ARCH: return "RM_E_UNSUPPORTED_ARCH";
        case RM_E_SHAPE:            return "RM_E_SHAPE";
        case RM_E_OOM:              return "RM_E_OOM";
        case RM_E_INVALID_ARG:      return "RM_E_INVALID_ARG";
        case RM_E_CUDA:             return "RM_E_CUDA";
        case RM_E_STATE:            return "RM_E_STATE";
        case RM_E_INTERNAL:         return "RM_E_INTERNAL";
        case RM_E_CONTEXT_FULL:     return "RM_E_CONTEXT_FULL";
        case RM_E_NO_RESIDUAL:      return "RM_E_NO_RESIDUAL";
        case RM_E_NEEDS_CPU:        return "RM_E_NEEDS_CPU";
        case RM_E_NOT_CALIBRATING:  return "RM_E_NOT_CALIBRATING";
        case RM_E_NO_BUDGET:        return "RM_E_NO_BUDGET";
    }
    return "RM_E_UNKNOWN";
}

void rm_abort_internal(const char * file, int line, const char * expr) {
    fprintf(stderr, "rapidmoe: internal invariant failed at %s:%d: %s\n", file, line, expr);
    abort();
}

#ifndef RM_BUILD_FLAGS
#define RM_BUILD_FLAGS ""
#endif

const char * rm_build_info(void) {
    return "rapidmoe abi " RM_STRINGIFY(RM_ABI_VERSION) "; compiler "
#if defined(__clang__)
        "clang " __clang_version__
#elif defined(__GNUC__)
        "gcc " __VERSION__
#else
        "unknown"
#endif
        "; cuda "
#ifdef RM_WITH_CUDA
        "on"
#else
        "off"
#endif
        "; cpu kernels "
#if defined(RM_AMX)
        "scalar avx2 avx512 amx"
#elif defined(RM_X86)
        "scalar avx2 avx512"
#else
        "scalar"
#endif
        "; flags " RM_BUILD_FLAGS;
}
