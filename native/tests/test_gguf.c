/* test_gguf.c - the GGUF reader from C: crafted files, the loader's typed getters, and every
 * truncation and byte corruption of a valid file (run under ASan by tools/asan_check.sh).
 *
 * The reader is compiled into this program (as llama2.c's test.c includes run.c), so the
 * internal getters of gguf.h can be called even though the library hides them. */
#include "status.c"
#include "gguf.c"

#include <math.h>

static int n_failed = 0;

/* The last error message contains s. */
#define HAS(s) (strstr(rm_last_error(), (s)) != NULL)

#define CHECK(cond) do { \
        if (!(cond)) { \
            fprintf(stderr, "%s:%d: CHECK(%s) failed; last error: %s\n", __FILE__, __LINE__, \
                    #cond, rm_last_error()); \
            n_failed++; \
        } \
    } while (0)

/* ---- a little byte writer ---------------------------------------------------------------- */

typedef struct buf { uint8_t b[4096]; size_t n; } buf;

static void put(buf * w, const void * p, size_t n) {
    RM_ASSERT(w->n + n <= sizeof(w->b));
    memcpy(w->b + w->n, p, n);
    w->n += n;
}
static void put_u32(buf * w, uint32_t v) { put(w, &v, 4); }
static void put_u64(buf * w, uint64_t v) { put(w, &v, 8); }
static void put_str(buf * w, const char * s) { put_u64(w, strlen(s)); put(w, s, strlen(s)); }
static void put_kv(buf * w, const char * key, uint32_t type) { put_str(w, key); put_u32(w, type); }
static void pad_to(buf * w, size_t a) { while (w->n % a) w->b[w->n++] = 0; }

static void put_info(buf * w, const char * name, int n_dims, const int64_t * ne, uint32_t type,
                     uint64_t offset) {
    put_str(w, name);
    put_u32(w, (uint32_t) n_dims);
    for (int d = 0; d < n_dims; d++) put_u64(w, (uint64_t) ne[d]);
    put_u32(w, type);
    put_u64(w, offset);
}

static char path[512];

static void write_file(const void * p, size_t n) {
    FILE * f = fopen(path, "wb");
    RM_ASSERT(f != NULL);
    RM_ASSERT(fwrite(p, 1, n, f) == n);
    fclose(f);
}

/* A valid file whose last byte is the last tensor's last byte: every proper prefix is invalid. */
static void build_valid(buf * w) {
    w->n = 0;
    put(w, "GGUF", 4);
    put_u32(w, 3);
    put_u64(w, 2);                                   /* tensors */
    put_u64(w, 10);                                  /* KV pairs */
    put_kv(w, "general.architecture", RM_GGUF_STRING); put_str(w, "test");
    put_kv(w, "a.u8", RM_GGUF_UINT8);                  { uint8_t v = 200; put(w, &v, 1); }
    put_kv(w, "a.i64", RM_GGUF_INT64);                 put_u64(w, (uint64_t) -5);
    put_kv(w, "a.big", RM_GGUF_UINT64);                put_u64(w, 1ull << 40);
    put_kv(w, "a.f64", RM_GGUF_FLOAT64);               { double v = 0.25; put(w, &v, 8); }
    put_kv(w, "a.f32", RM_GGUF_FLOAT32);               { float v = 1.5f; put(w, &v, 4); }
    put_kv(w, "a.bool", RM_GGUF_BOOL);                 { uint8_t v = 1; put(w, &v, 1); }
    put_kv(w, "a.arr", RM_GGUF_ARRAY);
    put_u32(w, RM_GGUF_FLOAT32); put_u64(w, 3);
    { const float v[3] = {1, 2, 3}; put(w, v, sizeof(v)); }
    put_kv(w, "a.toks", RM_GGUF_ARRAY);
    put_u32(w, RM_GGUF_STRING); put_u64(w, 2); put_str(w, "x"); put_str(w, "yz");
    put_kv(w, "general.alignment", RM_GGUF_UINT32);    put_u32(w, 16);
    const int64_t ne_w[1] = {8}, ne_q[2] = {32, 2};
    put_info(w, "w", 1, ne_w, RM_TYPE_F32, 0);
    put_info(w, "q", 2, ne_q, RM_TYPE_Q8_0, 32);
    pad_to(w, 16);
    for (int i = 0; i < 32 + 68; i++) w->b[w->n++] = (uint8_t) i;
}

static rm_status open_bytes(const buf * w, rm_gguf ** g) {
    write_file(w->b, w->n);
    return rm_gguf_open(path, g);
}

/* ---- tests --------------------------------------------------------------------------------- */

static void test_valid_file_and_getters(void) {
    buf w;
    build_valid(&w);
    rm_gguf * g = NULL;
    CHECK(open_bytes(&w, &g) == RM_OK);
    if (g == NULL) return;
    CHECK(rm_gguf_n_kv(g) == 10 && rm_gguf_n_tensors(g) == 2 && rm_gguf_alignment(g) == 16);

    uint32_t u32 = 0; int32_t i32 = 0; uint64_t u64 = 0; int64_t i64 = 0;
    float f = 0; bool b = false; rm_str s;
    CHECK(rm_gguf_get_u32(g, "a.u8", &u32) == RM_OK && u32 == 200);
    CHECK(rm_gguf_get_i32(g, "a.i64", &i32) == RM_OK && i32 == -5);
    CHECK(rm_gguf_get_i64(g, "a.i64", &i64) == RM_OK && i64 == -5);
    CHECK(rm_gguf_get_u32(g, "a.i64", &u32) == RM_E_FORMAT &&
          HAS("-5, which does not fit in uint32"));
    CHECK(rm_gguf_get_u32(g, "a.big", &u32) == RM_E_FORMAT && HAS("1099511627776"));
    CHECK(rm_gguf_get_u64(g, "a.big", &u64) == RM_OK && u64 == 1ull << 40);
    CHECK(rm_gguf_get_u32(g, "nope", &u32) == RM_GGUF_MISSING &&
          HAS("rm_gguf_get_u32: key 'nope' not found"));
    CHECK(rm_gguf_get_u32(g, "general.architecture", &u32) == RM_E_FORMAT &&
          HAS("has type str, expected an integer"));
    CHECK(rm_gguf_get_f32(g, "a.f64", &f) == RM_OK && f == 0.25f);
    CHECK(rm_gguf_get_f32(g, "a.f32", &f) == RM_OK && f == 1.5f);
    CHECK(rm_gguf_get_f32(g, "a.u8", &f) == RM_E_FORMAT);
    CHECK(rm_gguf_get_bool(g, "a.bool", &b) == RM_OK && b);
    CHECK(rm_gguf_get_bool(g, "a.u8", &b) == RM_E_FORMAT);
    CHECK(rm_gguf_get_str(g, "general.architecture", &s) == RM_OK && s.len == 4 &&
          memcmp(s.ptr, "test", 4) == 0);
    CHECK(rm_gguf_get_str(g, "a.arr", &s) == RM_E_FORMAT && HAS("has type arr, expected str"));
    CHECK(rm_last_error()[0] != '\0');

    rm_gguf_arr arr;
    CHECK(rm_gguf_get_arr(g, "a.arr", RM_GGUF_FLOAT32, &arr) == RM_OK && arr.n == 3 &&
          arr.data != NULL);
    if (arr.data) { float v[3]; memcpy(v, arr.data, sizeof(v)); CHECK(v[0] == 1 && v[2] == 3); }
    CHECK(rm_gguf_get_arr(g, "a.arr", RM_GGUF_INT32, &arr) == RM_E_FORMAT &&
          HAS("is an array of f32, expected an array of i32"));
    CHECK(rm_gguf_get_arr(g, "a.toks", -1, &arr) == RM_OK && arr.type == RM_GGUF_STRING &&
          arr.n == 2 && arr.data == NULL);
    s = rm_gguf_kv_arr_str(g, arr.kv, 1);
    CHECK(s.len == 2 && memcmp(s.ptr, "yz", 2) == 0);
    CHECK(rm_gguf_kv_arr_str(g, arr.kv, 2).ptr == NULL);
    CHECK(rm_gguf_get_arr(g, "a.u8", -1, &arr) == RM_E_FORMAT);
    CHECK(rm_gguf_get_u32(g, "a.u8", &u32) == RM_OK && rm_last_error()[0] == '\0');

    rm_tensor_info ti;
    CHECK(rm_gguf_tensor_by_name(g, "q", &ti) == RM_OK && ti.type == RM_TYPE_Q8_0 &&
          ti.nbytes == 68);
    CHECK(ti.offset == 32 && ti.ne[0] == 32 && ti.ne[1] == 2 && ti.ne[2] == 1 && ti.n_dims == 2);
    CHECK((const uint8_t *) ti.data == (const uint8_t *) g->map + rm_gguf_data_offset(g) + 32);
    CHECK(((const uint8_t *) ti.data)[67] == 99);
    CHECK(rm_gguf_tensor_by_name(g, "nope", &ti) == RM_GGUF_MISSING &&
          HAS("no tensor named 'nope'"));
    CHECK(rm_gguf_tensor_info(g, 2, &ti) == RM_E_INVALID_ARG);
    CHECK(rm_gguf_find_kv(g, "a.toks") == 8 && rm_gguf_find_kv(g, "a.tok") == -1);
    rm_gguf_close(g);
    rm_gguf_close(NULL);
}

typedef struct bad_case { const char * what; rm_status status; const char * needle; } bad_case;

static void expect_fail(const buf * w, bad_case c) {
    rm_gguf * g = (rm_gguf *) &g;                     /* must come back NULL */
    const rm_status st = open_bytes(w, &g);
    if (st != c.status || g != NULL || !HAS(c.needle)) {
        fprintf(stderr, "%s: got %s, \"%s\"; expected %s with \"%s\"\n", c.what,
                rm_status_str(st), rm_last_error(), rm_status_str(c.status), c.needle);
        n_failed++;
    }
}

static void test_malformed_files(void) {
    buf w;
    build_valid(&w); memcpy(w.b, "GGUG", 4);
    expect_fail(&w, (bad_case){"bad magic", RM_E_FORMAT, "bad magic 47 47 55 47"});
    build_valid(&w); w.b[4] = 1;
    expect_fail(&w, (bad_case){"version 1", RM_E_FORMAT, "version 1 is no longer supported"});
    build_valid(&w); w.n -= 1;
    expect_fail(&w, (bad_case){"short data", RM_E_FORMAT, "the data of tensor 'q' (68 bytes"});

    const int64_t ne[1] = {32};
    w.n = 0;
    put(&w, "GGUF", 4); put_u32(&w, 3); put_u64(&w, 1); put_u64(&w, 0);
    put_info(&w, "t", 1, ne, 37, 0);
    expect_fail(&w, (bad_case){"removed type", RM_E_UNSUPPORTED_TYPE, "ggml type 37 (IQ4_NL_4_8)"});

    w.n = 0;
    put(&w, "GGUF", 4); put_u32(&w, 3); put_u64(&w, 2); put_u64(&w, 0);
    put_info(&w, "t", 1, ne, RM_TYPE_F32, 0);
    put_info(&w, "t", 1, ne, RM_TYPE_F32, 128);
    pad_to(&w, 32);
    for (int i = 0; i < 256; i++) w.b[w.n++] = 0;
    expect_fail(&w, (bad_case){"duplicate tensor", RM_E_FORMAT,
                               "duplicate tensor name 't' (tensors 0 and 1)"});

    w.n = 0;
    put(&w, "GGUF", 4); put_u32(&w, 3); put_u64(&w, 0); put_u64(&w, 1);
    put_kv(&w, "n", RM_GGUF_ARRAY); put_u32(&w, RM_GGUF_ARRAY); put_u64(&w, 0);
    expect_fail(&w, (bad_case){"nested array", RM_E_FORMAT, "KV 'n' is an array of arrays"});

    w.n = 0;
    expect_fail(&w, (bad_case){"empty file", RM_E_FORMAT, "the file is empty"});

    rm_gguf * g = NULL;
    CHECK(rm_gguf_open("/nonexistent/dir/x.gguf", &g) == RM_E_IO && g == NULL &&
          HAS("No such file or directory"));
    CHECK(rm_gguf_open("/", &g) == RM_E_IO && HAS("is a directory"));
    CHECK(rm_gguf_open(NULL, &g) == RM_E_INVALID_ARG);
    CHECK(rm_gguf_open(path, NULL) == RM_E_INVALID_ARG);
}

/* Reads everything an open file exposes, so that ASan sees any pointer that leaves the mapping. */
static uint64_t touch_all(const rm_gguf * g) {
    uint64_t sum = 0;
    for (int64_t i = 0; i < rm_gguf_n_kv(g); i++) {
        const rm_str key = rm_gguf_kv_key(g, i);
        for (uint64_t k = 0; k < key.len; k++) sum += (uint8_t) key.ptr[k];
        const rm_str s = rm_gguf_kv_str(g, i);
        for (uint64_t k = 0; k < s.len; k++) sum += (uint8_t) s.ptr[k];
        const int32_t t = rm_gguf_kv_arr_type(g, i);
        const uint64_t n = rm_gguf_kv_arr_n(g, i);
        const uint8_t * d = rm_gguf_kv_data(g, i);
        const uint64_t size = t == -1 ? (d ? gguf_value_size[rm_gguf_kv_type(g, i)] : 0)
                                      : (t == RM_GGUF_STRING ? 0 : n * gguf_value_size[t]);
        for (uint64_t k = 0; k < size; k++) sum += d[k];
        for (uint64_t j = 0; t == RM_GGUF_STRING && j < n; j++) {
            const rm_str e = rm_gguf_kv_arr_str(g, i, j);
            for (uint64_t k = 0; k < e.len; k++) sum += (uint8_t) e.ptr[k];
        }
    }
    for (int64_t i = 0; i < rm_gguf_n_tensors(g); i++) {
        rm_tensor_info ti;
        if (rm_gguf_tensor_info(g, i, &ti) != RM_OK) { n_failed++; continue; }
        for (uint64_t k = 0; k < ti.nbytes; k++) sum += ((const uint8_t *) ti.data)[k];
        for (uint64_t k = 0; k < ti.name.len; k++) sum += (uint8_t) ti.name.ptr[k];
    }
    return sum;
}

static void test_every_prefix_and_byte_corruption(void) {
    buf w;
    build_valid(&w);
    const buf valid = w;
    for (size_t n = 0; n < valid.n; n++) {           /* every proper prefix is refused */
        w.n = n;
        rm_gguf * g = NULL;
        const rm_status st = open_bytes(&w, &g);
        if (st == RM_OK || g != NULL || rm_last_error()[0] == '\0') {
            fprintf(stderr, "prefix of %zu bytes: %s\n", n, rm_status_str(st));
            n_failed++;
        }
        rm_gguf_close(g);
    }
    int n_opened = 0;
    for (size_t pos = 0; pos < valid.n; pos++) {     /* every byte, set to 0x00, 0xff, 0x80 */
        static const uint8_t vals[3] = {0x00, 0xff, 0x80};
        for (int v = 0; v < 3; v++) {
            w = valid;
            w.b[pos] = vals[v];
            rm_gguf * g = NULL;
            if (open_bytes(&w, &g) == RM_OK) {
                n_opened++;
                (void) touch_all(g);
            } else if (rm_last_error()[0] == '\0') {
                fprintf(stderr, "corruption at %zu: no message\n", pos);
                n_failed++;
            }
            rm_gguf_close(g);
        }
    }
    CHECK(n_opened > 0);
}

int main(void) {
    const char * tmp = getenv("TMPDIR");
    snprintf(path, sizeof(path), "%s/rm_test_gguf_%d.gguf", tmp && *tmp ? tmp : "/tmp",
             (int) getpid());
    test_valid_file_and_getters();
    test_malformed_files();
    test_every_prefix_and_byte_corruption();
    remove(path);
    if (n_failed) {
        fprintf(stderr, "test_gguf: %d check(s) failed\n", n_failed);
        return 1;
    }
    printf("test_gguf: ok\n");
    return 0;
}
