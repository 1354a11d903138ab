/* gguf.h - internal: typed access to an open GGUF file, for the model loader.
 *
 * The public reader (rm_gguf_open and friends in rapidmoe.h) validates the whole file at open;
 * these helpers read one metadata value by key and say exactly why when they cannot:
 *
 *   RM_OK            the value was written to *out;
 *   RM_GGUF_MISSING  the key is absent (nothing written), so a loader can fall back to a
 *                    default for an optional key, or report a required one as missing;
 *   RM_E_FORMAT      the key is present but its type does not convert, or its value does not
 *                    fit the requested C type.
 *
 * Either failure sets the last-error message, naming the function, the key and the value.
 * Arguments must not be NULL (these are internal calls; a NULL is a bug, not bad input).
 */
#ifndef RM_GGUF_H
#define RM_GGUF_H

#include "rapidmoe.h"

#include <stdbool.h>

/* The getters' status for an absent key, distinct from RM_E_FORMAT (present but unusable). */
#define RM_GGUF_MISSING RM_E_INVALID_ARG

/* rm_gguf_open with how the file comes into memory: RM_LOAD_AUTO, RM_LOAD_MMAP or RM_LOAD_READ
 * (rm_model_params.load). rm_gguf_open maps. */
rm_status rm_gguf_open_load(const char * path, int32_t load, rm_gguf ** out);

/* The pages wholly inside [p, p + bytes) of g's bytes handed back, where something else now holds
 * what they hold (weights a device keeps in a layout of its own): a mapping's released (they read
 * back from the file), a read copy's mapped from the file again (the same bytes, read only where
 * something reads them). Returns 0 when the range is not g's, else 1. */
int rm_gguf_give_back(const rm_gguf * g, const void * p, uint64_t bytes);

/* The file's first byte in memory (a tensor's data minus this is its file offset), and its size. */
const uint8_t * rm_gguf_map(const rm_gguf * g);
uint64_t        rm_gguf_size(const rm_gguf * g);

/* A mapped file's pages outside the skipped ranges (byte ranges of the mapping) replaced, in place,
 * by anonymous pages holding the same bytes: resident whatever the memory pressure, as a read
 * file is, while the skipped ranges stay mapped (and read without read-ahead). A read file is
 * resident already. RM_LOAD_STREAM's weights other than the routed experts. */
typedef struct rm_byte_range {
    const uint8_t * p;
    uint64_t        bytes;
} rm_byte_range;
rm_status rm_gguf_keep_resident(rm_gguf * g, const char * path, rm_byte_range * skip, int64_t n_skip);

/* The memory this process may still take: MemAvailable, or the room under its memory cgroup's
 * limit where that is less (UINT64_MAX when neither is known). */
uint64_t rm_memory_room(void);

/* Integers: any of the eight integer kv types, as long as the value fits. */
rm_status rm_gguf_get_u32(const rm_gguf * g, const char * key, uint32_t * out);
rm_status rm_gguf_get_i32(const rm_gguf * g, const char * key, int32_t  * out);
rm_status rm_gguf_get_u64(const rm_gguf * g, const char * key, uint64_t * out);
rm_status rm_gguf_get_i64(const rm_gguf * g, const char * key, int64_t  * out);

/* FLOAT32, or FLOAT64 rounded to float. */
rm_status rm_gguf_get_f32(const rm_gguf * g, const char * key, float * out);

/* BOOL only; any non-zero byte is true, as in ggml. */
rm_status rm_gguf_get_bool(const rm_gguf * g, const char * key, bool * out);

/* STRING only; the bytes stay in the mapping (valid until rm_gguf_close). */
rm_status rm_gguf_get_str(const rm_gguf * g, const char * key, rm_str * out);

/* An ARRAY value. For numbers and bools, `data` points at the first of `n` packed little-endian
 * elements in the mapping (not necessarily aligned: read them with memcpy); NULL when n == 0 or
 * for string arrays, whose elements are read with rm_gguf_kv_arr_str(g, kv, j). */
typedef struct rm_gguf_arr {
    int64_t      kv;              /* index of the kv pair */
    int32_t      type;            /* rm_gguf_type of the elements */
    uint64_t     n;
    const void * data;
} rm_gguf_arr;

/* elem_type: the element type required, or -1 to accept any. */
rm_status rm_gguf_get_arr(const rm_gguf * g, const char * key, int32_t elem_type, rm_gguf_arr * out);

/* The tensor called `name`; RM_GGUF_MISSING when there is none. */
rm_status rm_gguf_tensor_by_name(const rm_gguf * g, const char * name, rm_tensor_info * out);

/* "u32", "f32", "arr", ... for messages; "?" for an unknown id. */
const char * rm_gguf_type_name(int32_t type);

#endif
