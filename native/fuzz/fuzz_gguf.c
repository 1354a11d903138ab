/* fuzz_gguf.c - libFuzzer target: the GGUF reader on arbitrary bytes.
 *
 * Opens the input as a file, and when the reader accepts it, reads back everything it indexed
 * through every accessor (the public ones and the loader's typed getters), touching the first and
 * last byte of every string and tensor it hands out. Under AddressSanitizer the reader copies the
 * file into a heap block of exactly its size (gguf.c), so any byte read past the end is reported.
 * A rejected input must leave a message naming the function. Besides libFuzzer's byte mutations,
 * tensors are dropped, renamed and swapped (gguf_mutate.h). */
#include "fuzz_file.h"
#include "gguf.h"
#include "gguf_mutate.h"

#include <string.h>

static volatile uint8_t sink;

static void touch(const void * p, uint64_t n) {
    if (n > 0) {
        sink ^= ((const uint8_t *) p)[0] ^ ((const uint8_t *) p)[n - 1];
    }
}

static void touch_str(rm_str s) { touch(s.ptr, s.len); }

/* A key or tensor name as a NUL-terminated string, for the lookups by name. */
static const char * cstr(rm_str s, char * buf, size_t cap) {
    const size_t n = s.len < cap - 1 ? (size_t) s.len : cap - 1;
    memcpy(buf, s.ptr, n);
    buf[n] = '\0';
    return buf;
}

static void read_kvs(const rm_gguf * g) {
    const int64_t n = rm_gguf_n_kv(g);
    for (int64_t i = 0; i < n; i++) {
        char key[256];
        const rm_str k = rm_gguf_kv_key(g, i);
        touch_str(k);
        cstr(k, key, sizeof(key));
        (void) rm_gguf_find_kv(g, key);
        const int32_t type = rm_gguf_kv_type(g, i);
        const void * data = rm_gguf_kv_data(g, i);
        if (type == RM_GGUF_STRING) {
            touch_str(rm_gguf_kv_str(g, i));
        } else if (type == RM_GGUF_ARRAY) {
            const uint64_t an = rm_gguf_kv_arr_n(g, i);
            if (rm_gguf_kv_arr_type(g, i) == RM_GGUF_STRING) {
                for (uint64_t j = 0; j < an && j < 4096; j++) {
                    touch_str(rm_gguf_kv_arr_str(g, i, j));
                }
                touch_str(rm_gguf_kv_arr_str(g, i, an - 1));
                (void) rm_gguf_kv_arr_str(g, i, an);           /* out of range: empty */
            }
        } else if (data != NULL) {
            touch(data, 1);
        }
        /* The loader's getters, each of which converts or refuses with a status. */
        uint32_t u32; int32_t i32; uint64_t u64; int64_t i64; float f; bool b; rm_str s; rm_gguf_arr arr;
        (void) rm_gguf_get_u32(g, key, &u32);
        (void) rm_gguf_get_i32(g, key, &i32);
        (void) rm_gguf_get_u64(g, key, &u64);
        (void) rm_gguf_get_i64(g, key, &i64);
        (void) rm_gguf_get_f32(g, key, &f);
        (void) rm_gguf_get_bool(g, key, &b);
        if (rm_gguf_get_str(g, key, &s) == RM_OK) {
            touch_str(s);
        }
        if (rm_gguf_get_arr(g, key, -1, &arr) == RM_OK && arr.data != NULL && arr.type != RM_GGUF_STRING) {
            touch(arr.data, 1);
        }
    }
    (void) rm_gguf_kv_key(g, n);                                /* out of range */
    (void) rm_gguf_kv_type(g, -1);
}

static void read_tensors(const rm_gguf * g) {
    const int64_t n = rm_gguf_n_tensors(g);
    for (int64_t i = 0; i < n; i++) {
        rm_tensor_info ti;
        if (rm_gguf_tensor_info(g, i, &ti) != RM_OK) {
            abort();                                            /* an index the reader gave out */
        }
        touch_str(ti.name);
        touch(ti.data, ti.nbytes);
        char name[256];
        if (rm_gguf_find_tensor(g, cstr(ti.name, name, sizeof(name))) < 0 && ti.name.len < sizeof(name)) {
            abort();                                            /* every indexed name is found */
        }
        rm_tensor_info by_name;
        (void) rm_gguf_tensor_by_name(g, name, &by_name);
    }
    rm_tensor_info none;
    if (rm_gguf_tensor_info(g, n, &none) == RM_OK) {
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    static fuzz_file file;
    const char * path = fuzz_file_set(&file, "fuzz.gguf", data, size);
    rm_gguf * g = NULL;
    const rm_status st = rm_gguf_open(path, &g);
    if (fuzz_verbose()) {
        fprintf(stderr, "fuzz_gguf: %zu bytes: %s %s\n", size, rm_status_str(st), rm_last_error());
    }
    if (st != RM_OK) {
        if (g != NULL || strncmp(rm_last_error(), "rm_gguf_open: ", 14) != 0) {
            abort();                                            /* a failure leaves no handle, and says why */
        }
        return 0;
    }
    if (rm_gguf_file_size(g) != size || rm_gguf_data_offset(g) > size) {
        abort();
    }
    read_kvs(g);
    read_tensors(g);
    rm_gguf_close(g);
    return 0;
}

size_t LLVMFuzzerCustomMutator(uint8_t * data, size_t size, size_t max_size, unsigned int seed) {
    return gm_mutate_file(data, size, max_size, seed);
}
