/* gguf.c - the GGUF reader: map the file read-only, check every byte of its structure, index it.
 *
 * Layout (docs/gguf.md in ggml): header {magic "GGUF", u32 version, u64 n_tensors, u64 n_kv},
 * n_kv pairs {string key, u32 value type, value}, n_tensors infos {string name, u32 n_dims,
 * u64 ne[n_dims], u32 ggml type, u64 offset}, zero padding to the alignment, then tensor data.
 * Strings are a u64 byte length followed by the bytes. Everything is little-endian.
 *
 * Nothing in the file is trusted. Every count, length and offset is checked against the bytes
 * that are actually there before it is used, so a corrupt or hostile file can neither make the
 * reader touch memory outside the mapping nor make it allocate more than a small multiple of the
 * file's size. The rules are ggml's (src/gguf.cpp, gguf_init_from_file_impl), so a file we open
 * is one llama.cpp opens too, with two deliberate extras: n_dims must be at least 1, and keys
 * and tensor names must be valid UTF-8 without NUL bytes (they become Python str dict keys).
 *
 * Statuses from rm_gguf_open:
 *   RM_E_IO                the file cannot be opened, stat'ed or mapped, or is not a regular file;
 *   RM_E_FORMAT            anything malformed, including a tensor type id ggml has never had;
 *   RM_E_UNSUPPORTED_TYPE  a tensor type id ggml once had and removed (4, 5, 31-33, 36-38);
 *   RM_E_OOM               the index could not be allocated.
 *
 * The mapping is private and read-only. If another process truncates the file while it is
 * mapped, touching the lost pages raises SIGBUS; no reader of a mapped file can prevent that.
 */
#include "gguf.h"
#include "status.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF reader reads little-endian fields in place; a big-endian host is not supported"
#endif

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_NAME          64     /* ggml's GGML_MAX_NAME: a tensor name must be shorter */
#define GGUF_HEADER_BYTES      24
#define GGUF_KV_MIN_BYTES      14     /* key length, a 1-byte key, value type, a 1-byte value */
#define GGUF_INFO_MIN_BYTES    32     /* name length, n_dims, one dim, type, offset */

/* Bytes per element of each kv value type; 0 for STRING and ARRAY, which have no fixed size. */
static const uint8_t gguf_value_size[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
static const char * const gguf_value_name[13] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "arr", "u64", "i64", "f64",
};

const char * rm_gguf_type_name(int32_t type) {
    return type >= 0 && type < 13 ? gguf_value_name[type] : "?";
}

/* ---------------------------------------------------------------------------------------------
 * The handle
 * ------------------------------------------------------------------------------------------- */

typedef struct kv_rec {
    rm_str   key;                     /* first member: the name index reads it (see name_index) */
    int32_t  type;                    /* rm_gguf_type */
    int32_t  arr_type;                /* element type of an ARRAY, else -1 */
    uint64_t arr_n;                   /* element count of an ARRAY, else 0 */
    uint64_t val_off;                 /* file offset of the scalar / string bytes / first element */
    uint64_t str_len;                 /* a STRING value's length */
    /* A string ARRAY: where element j's length prefix is, relative to val_off. Vocabularies have
     * 10^5..10^6 entries, so offsets are stored as u32 whenever the array fits in 4 GiB. */
    void *   str_offs;
    int32_t  str_offs_wide;           /* str_offs holds uint64_t, else uint32_t */
} kv_rec;

typedef struct tensor_rec {
    rm_str   name;                    /* first member: the name index reads it */
    int32_t  type;                    /* ggml type id */
    int32_t  n_dims;
    int64_t  ne[4];                   /* unused dims are 1 */
    uint64_t offset;                  /* relative to the data section */
    uint64_t nbytes;
} tensor_rec;

/* Open addressing over the names of an array of records that start with an rm_str. */
typedef struct name_index {
    int64_t *    slots;               /* record index + 1; 0 = empty; a power-of-two count */
    uint64_t     mask;
    const char * base;                /* the first record */
    size_t       stride;              /* bytes from one record to the next */
} name_index;

struct rm_gguf {
    const uint8_t * map;              /* the whole file, PROT_READ */
    uint64_t        size;
    int             read;             /* map holds the file read into anonymous memory (read_contents) */
    int             fd;               /* a read copy's file, for rm_gguf_give_back; else -1 */
    uint32_t        version;
    uint32_t        alignment;
    uint64_t        data_offset;      /* file offset of the data section */
    uint64_t        infos_begin;      /* file offsets of the tensor-info block: [begin, end) */
    uint64_t        infos_end;
    int64_t         n_kv;
    kv_rec *        kv;
    name_index      kv_index;
    int64_t         n_tensors;
    tensor_rec *    tensors;
    name_index      tensor_index;
};

static uint64_t name_hash(const char * p, uint64_t n) {
    uint64_t h = 0xcbf29ce484222325ull;            /* FNV-1a */
    for (uint64_t i = 0; i < n; i++) {
        h = (h ^ (uint8_t) p[i]) * 0x100000001b3ull;
    }
    return h;
}

static rm_status index_init(name_index * ix, int64_t n, const void * base, size_t stride) {
    uint64_t cap = 8;
    while (cap < 2 * (uint64_t) n) {               /* load <= 1/2, so probing always ends */
        cap *= 2;
    }
    ix->slots  = calloc(cap, sizeof(int64_t));
    ix->mask   = cap - 1;
    ix->base   = base;
    ix->stride = stride;
    return ix->slots ? RM_OK : RM_E_OOM;
}

static const rm_str * index_name(const name_index * ix, int64_t i) {
    return (const rm_str *) (const void *) (ix->base + (size_t) i * ix->stride);
}

static int64_t index_find(const name_index * ix, const char * p, uint64_t n) {
    if (ix->slots == NULL) {
        return -1;
    }
    for (uint64_t h = name_hash(p, n) & ix->mask;; h = (h + 1) & ix->mask) {
        const int64_t s = ix->slots[h];
        if (s == 0) {
            return -1;
        }
        const rm_str * name = index_name(ix, s - 1);
        if (name->len == n && memcmp(name->ptr, p, n) == 0) {
            return s - 1;
        }
    }
}

/* Adds record i; returns -1, or the index of an earlier record with the same name. */
static int64_t index_add(name_index * ix, int64_t i) {
    const rm_str * name = index_name(ix, i);
    uint64_t h = name_hash(name->ptr, name->len) & ix->mask;
    for (; ix->slots[h] != 0; h = (h + 1) & ix->mask) {
        const rm_str * other = index_name(ix, ix->slots[h] - 1);
        if (other->len == name->len && memcmp(other->ptr, name->ptr, name->len) == 0) {
            return ix->slots[h] - 1;
        }
    }
    ix->slots[h] = i + 1;
    return -1;
}

/* ---------------------------------------------------------------------------------------------
 * Reading with bounds checks, and saying exactly what was wrong
 * ------------------------------------------------------------------------------------------- */

typedef struct reader {
    rm_gguf *    g;
    const char * path;
    uint64_t     pos;                 /* next byte to read; always <= g->size */
} reader;

static uint64_t bytes_left(const reader * r) { return r->g->size - r->pos; }

/* "rm_gguf_open: <path>: <message>" as the last error. */
static rm_status fail(const reader * r, rm_status status, const char * fmt, ...) RM_PRINTF(3, 4);
static rm_status fail(const reader * r, rm_status status, const char * fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return rm_fail(status, "rm_gguf_open: %s: %s", r->path, msg);
}

/* The file ends before the `need` bytes of <what> starting at the current position. */
static rm_status truncated(const reader * r, uint64_t need, const char * fmt, ...) RM_PRINTF(3, 4);
static rm_status truncated(const reader * r, uint64_t need, const char * fmt, ...) {
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    return fail(r, RM_E_FORMAT,
                "truncated or corrupt file: %s needs %" PRIu64 " bytes at offset %" PRIu64
                " but only %" PRIu64 " are left (file size %" PRIu64 ")",
                what, need, r->pos, bytes_left(r), r->g->size);
}

/* Well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF), without NUL. */
static bool valid_utf8(rm_str s) {
    const unsigned char * p = (const unsigned char *) s.ptr;
    uint64_t i = 0;
    while (i < s.len) {
        const unsigned char c = p[i];
        if (c == 0) {
            return false;
        }
        if (c < 0x80) {
            i++;
            continue;
        }
        int n;
        uint32_t cp, min;
        if ((c & 0xe0) == 0xc0)      { n = 1; cp = c & 0x1f; min = 0x80; }
        else if ((c & 0xf0) == 0xe0) { n = 2; cp = c & 0x0f; min = 0x800; }
        else if ((c & 0xf8) == 0xf0) { n = 3; cp = c & 0x07; min = 0x10000; }
        else return false;
        if (s.len - i <= (uint64_t) n) {
            return false;
        }
        for (int k = 1; k <= n; k++) {
            if ((p[i + k] & 0xc0) != 0x80) {
                return false;
            }
            cp = (cp << 6) | (p[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
            return false;
        }
        i += (uint64_t) n + 1;
    }
    return true;
}

/* A name from the file, printable in a message: at most 80 bytes; control bytes, quotes and
 * (unless the whole name is valid UTF-8) bytes >= 0x80 escaped as \xNN. */
typedef struct quoted { char s[4 * 80 + 8]; } quoted;

static quoted quote(rm_str name) {
    quoted q;
    size_t o = 0;
    const bool utf8 = valid_utf8(name);
    for (uint64_t i = 0; i < name.len && i < 80; i++) {
        const unsigned char c = (unsigned char) name.ptr[i];
        if ((c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') || (c >= 0x80 && utf8)) {
            q.s[o++] = (char) c;
        } else {
            o += (size_t) snprintf(q.s + o, sizeof(q.s) - o, "\\x%02x", c);
        }
    }
    if (name.len > 80) {
        memcpy(q.s + o, "...", 4);
    } else {
        q.s[o] = '\0';
    }
    return q;
}

static bool read_u32(reader * r, uint32_t * v) {
    if (bytes_left(r) < 4) {
        return false;
    }
    memcpy(v, r->g->map + r->pos, 4);
    r->pos += 4;
    return true;
}

static bool read_u64(reader * r, uint64_t * v) {
    if (bytes_left(r) < 8) {
        return false;
    }
    memcpy(v, r->g->map + r->pos, 8);
    r->pos += 8;
    return true;
}

/* Reads a string's u64 length. The caller checks the bytes are there (it knows what to call them). */
static bool read_len(reader * r, uint64_t * len) { return read_u64(r, len); }

static rm_str take_str(reader * r, uint64_t len) {
    rm_str s = {(const char *) r->g->map + r->pos, len};
    r->pos += len;
    return s;
}

/* ---------------------------------------------------------------------------------------------
 * Header
 * ------------------------------------------------------------------------------------------- */

static rm_status parse_header(reader * r, int64_t * n_tensors, int64_t * n_kv) {
    rm_gguf * g = r->g;
    if (g->size < 4) {
        return truncated(r, GGUF_HEADER_BYTES, "the header");
    }
    if (memcmp(g->map, "GGUF", 4) != 0) {
        const uint8_t * m = g->map;
        return fail(r, RM_E_FORMAT,
                    "not a GGUF file: bad magic %02x %02x %02x %02x, expected 47 47 55 46 ('GGUF')",
                    m[0], m[1], m[2], m[3]);
    }
    r->pos = 4;
    uint32_t version;
    if (!read_u32(r, &version)) {
        return truncated(r, 4, "the header's version");
    }
    if (version == 0) {
        return fail(r, RM_E_FORMAT, "bad GGUF version 0");
    }
    if ((version & 0xffff) == 0) {
        return fail(r, RM_E_FORMAT,
                    "GGUF version reads as 0x%08" PRIx32 ": the file looks byte-swapped "
                    "(big-endian); only little-endian GGUF files are supported", version);
    }
    if (version == 1) {
        return fail(r, RM_E_FORMAT, "GGUF version 1 is no longer supported (use version 2 or 3)");
    }
    if (version > 3) {
        return fail(r, RM_E_FORMAT,
                    "GGUF version %" PRIu32 " is newer than this reader supports (2 and 3)", version);
    }
    g->version = version;

    uint64_t raw_tensors, raw_kv;
    if (!read_u64(r, &raw_tensors)) {
        return truncated(r, 8, "the header's tensor count");
    }
    if (!read_u64(r, &raw_kv)) {
        return truncated(r, 8, "the header's KV count");
    }
    *n_tensors = (int64_t) raw_tensors;
    *n_kv      = (int64_t) raw_kv;
    if (*n_tensors < 0) {
        return fail(r, RM_E_FORMAT, "tensor count %" PRId64 " is negative", *n_tensors);
    }
    if (*n_kv < 0) {
        return fail(r, RM_E_FORMAT, "KV count %" PRId64 " is negative", *n_kv);
    }
    /* The tensor count is checked the same way once the KV pairs are read (see parse). */
    if ((uint64_t) *n_kv > bytes_left(r) / GGUF_KV_MIN_BYTES) {
        return fail(r, RM_E_FORMAT,
                    "KV count %" PRId64 " cannot fit: the %" PRIu64 " bytes after the header hold "
                    "at most %" PRIu64 " KV pairs of %d bytes or more (corrupt count or truncated "
                    "file)", *n_kv, bytes_left(r), bytes_left(r) / GGUF_KV_MIN_BYTES,
                    GGUF_KV_MIN_BYTES);
    }
    return RM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Key-value pairs
 * ------------------------------------------------------------------------------------------- */

/* The elements of a string array: each a u64 length and its bytes, all checked. */
static rm_status parse_str_array(reader * r, kv_rec * kv) {
    const quoted key = quote(kv->key);
    if (kv->arr_n > bytes_left(r) / 8) {
        return fail(r, RM_E_FORMAT,
                    "KV '%s' claims %" PRIu64 " strings, but the %" PRIu64 " bytes left in the "
                    "file hold at most %" PRIu64, key.s, kv->arr_n, bytes_left(r), bytes_left(r) / 8);
    }
    if (kv->arr_n == 0) {
        return RM_OK;
    }
    /* Every offset is below bytes_left(r), so that decides whether u32 is enough. */
    kv->str_offs_wide = bytes_left(r) > UINT32_MAX;
    kv->str_offs = malloc(kv->arr_n * (kv->str_offs_wide ? sizeof(uint64_t) : sizeof(uint32_t)));
    if (kv->str_offs == NULL) {
        return fail(r, RM_E_OOM, "out of memory indexing the %" PRIu64 " strings of KV '%s'",
                    kv->arr_n, key.s);
    }
    for (uint64_t j = 0; j < kv->arr_n; j++) {
        const uint64_t rel = r->pos - kv->val_off;
        uint64_t len;
        if (!read_len(r, &len)) {
            return truncated(r, 8, "the length of string %" PRIu64 " of array KV '%s'", j, key.s);
        }
        if (len > bytes_left(r)) {
            return truncated(r, len, "string %" PRIu64 " of array KV '%s'", j, key.s);
        }
        r->pos += len;
        if (kv->str_offs_wide) {
            ((uint64_t *) kv->str_offs)[j] = rel;
        } else {
            ((uint32_t *) kv->str_offs)[j] = (uint32_t) rel;
        }
    }
    return RM_OK;
}

/* The value of kv pair i, whose key and type have been read. */
static rm_status parse_value(reader * r, kv_rec * kv) {
    const quoted key = quote(kv->key);
    if (kv->type == RM_GGUF_ARRAY) {
        uint32_t elem;
        if (!read_u32(r, &elem)) {
            return truncated(r, 4, "the element type of array KV '%s'", key.s);
        }
        if (!read_u64(r, &kv->arr_n)) {
            return truncated(r, 8, "the element count of array KV '%s'", key.s);
        }
        kv->arr_type = (int32_t) elem;
        if (elem == RM_GGUF_ARRAY) {
            return fail(r, RM_E_FORMAT, "KV '%s' is an array of arrays (nested arrays are not "
                        "supported, as in ggml)", key.s);
        }
        if (elem >= 13) {
            return fail(r, RM_E_FORMAT, "KV '%s' is an array of unknown element type %" PRIu32
                        " (valid types are 0 to 12)", key.s, elem);
        }
        kv->val_off = r->pos;
        if (elem == RM_GGUF_STRING) {
            return parse_str_array(r, kv);
        }
        const uint64_t esize = gguf_value_size[elem];
        if (kv->arr_n > bytes_left(r) / esize) {
            return fail(r, RM_E_FORMAT,
                        "KV '%s' claims %" PRIu64 " elements of type %s, which need more than the "
                        "%" PRIu64 " bytes left in the file", key.s, kv->arr_n,
                        gguf_value_name[elem], bytes_left(r));
        }
        r->pos += kv->arr_n * esize;
        return RM_OK;
    }
    if (kv->type == RM_GGUF_STRING) {
        if (!read_len(r, &kv->str_len)) {
            return truncated(r, 8, "the string length of KV '%s'", key.s);
        }
        if (kv->str_len > bytes_left(r)) {
            return truncated(r, kv->str_len, "the string value of KV '%s'", key.s);
        }
        kv->val_off = r->pos;
        r->pos += kv->str_len;
        return RM_OK;
    }
    const uint64_t size = gguf_value_size[kv->type];
    if (size > bytes_left(r)) {
        return truncated(r, size, "the %s value of KV '%s'", gguf_value_name[kv->type], key.s);
    }
    kv->val_off = r->pos;
    r->pos += size;
    return RM_OK;
}

static rm_status parse_kvs(reader * r) {
    rm_gguf * g = r->g;
    for (int64_t i = 0; i < g->n_kv; i++) {
        kv_rec * kv = &g->kv[i];
        kv->arr_type = -1;
        uint64_t len;
        if (!read_len(r, &len)) {
            return truncated(r, 8, "the key length of KV %" PRId64, i);
        }
        if (len > bytes_left(r)) {
            return truncated(r, len, "the key of KV %" PRId64, i);
        }
        kv->key = take_str(r, len);
        if (len == 0) {
            return fail(r, RM_E_FORMAT, "KV %" PRId64 " has an empty key", i);
        }
        const quoted key = quote(kv->key);
        if (!valid_utf8(kv->key)) {
            return fail(r, RM_E_FORMAT, "the key of KV %" PRId64 " ('%s') is not valid UTF-8 "
                        "or contains a NUL byte", i, key.s);
        }
        const int64_t dup = index_add(&g->kv_index, i);
        if (dup >= 0) {
            return fail(r, RM_E_FORMAT, "duplicate key '%s' (KV %" PRId64 " and KV %" PRId64 ")",
                        key.s, dup, i);
        }
        uint32_t type;
        if (!read_u32(r, &type)) {
            return truncated(r, 4, "the value type of KV '%s'", key.s);
        }
        if (type >= 13) {
            return fail(r, RM_E_FORMAT, "KV '%s' has unknown value type %" PRIu32
                        " (valid types are 0 to 12)", key.s, type);
        }
        kv->type = (int32_t) type;
        const rm_status st = parse_value(r, kv);
        if (st != RM_OK) {
            return st;
        }
    }
    return RM_OK;
}

static rm_status read_alignment(reader * r) {
    rm_gguf * g = r->g;
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const int64_t i = index_find(&g->kv_index, "general.alignment", strlen("general.alignment"));
    if (i < 0) {
        return RM_OK;
    }
    const kv_rec * kv = &g->kv[i];
    if (kv->type != RM_GGUF_UINT32) {
        return fail(r, RM_E_FORMAT, "general.alignment has type %s; it must be u32",
                    gguf_value_name[kv->type]);
    }
    uint32_t a;
    memcpy(&a, g->map + kv->val_off, 4);
    if (a == 0) {
        return fail(r, RM_E_FORMAT, "general.alignment is 0; it must be a non-zero power of two");
    }
    if ((a & (a - 1)) != 0) {
        return fail(r, RM_E_FORMAT, "general.alignment %" PRIu32 " is not a power of two", a);
    }
    g->alignment = a;
    return RM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Tensor infos and data
 * ------------------------------------------------------------------------------------------- */

/* Shape, type and size of tensor t, whose name has been read. */
static rm_status parse_tensor_shape(reader * r, tensor_rec * t) {
    const quoted name = quote(t->name);
    uint32_t n_dims;
    if (!read_u32(r, &n_dims)) {
        return truncated(r, 4, "the n_dims of tensor '%s'", name.s);
    }
    if (n_dims < 1 || n_dims > 4) {
        return fail(r, RM_E_FORMAT, "tensor '%s' has n_dims %" PRIu32 "; it must be 1 to 4",
                    name.s, n_dims);
    }
    t->n_dims = (int32_t) n_dims;
    int64_t n_elem = 1;
    bool overflow = false;
    for (int d = 0; d < 4; d++) {
        t->ne[d] = 1;
        if ((uint32_t) d < n_dims) {
            uint64_t raw;
            if (!read_u64(r, &raw)) {
                return truncated(r, 8, "ne[%d] of tensor '%s'", d, name.s);
            }
            t->ne[d] = (int64_t) raw;
        }
        if (t->ne[d] < 0) {
            return fail(r, RM_E_FORMAT, "tensor '%s' has ne[%d] = %" PRId64 "; dimensions must "
                        "not be negative", name.s, d, t->ne[d]);
        }
        overflow = overflow || __builtin_mul_overflow(n_elem, t->ne[d], &n_elem);
    }
    if (overflow) {
        return fail(r, RM_E_FORMAT, "tensor '%s' has shape ne = {%" PRId64 ", %" PRId64 ", %"
                    PRId64 ", %" PRId64 "}, whose element count overflows int64",
                    name.s, t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
    }

    uint32_t type;
    if (!read_u32(r, &type)) {
        return truncated(r, 4, "the type of tensor '%s'", name.s);
    }
    if (type >= RM_TYPE_COUNT) {
        return fail(r, RM_E_FORMAT, "tensor '%s' has invalid ggml type %" PRId32
                    " (ggml type ids are 0 to %d)", name.s, (int32_t) type, RM_TYPE_COUNT - 1);
    }
    t->type = (int32_t) type;
    /* the one type table (types.c), through the public call: test_gguf.c compiles this file
     * into a program that links the library, which exports no internals */
    rm_type_info tinfo;
    const rm_type_info * ts = &tinfo;
    if (rm_type_describe_any((int32_t) type, &tinfo) != RM_OK) {
        return fail(r, RM_E_UNSUPPORTED_TYPE, "tensor '%s' has ggml type %" PRIu32 " (%s), "
                    "which ggml has removed", name.s, type, tinfo.name);
    }
    if (t->ne[0] % ts->block_elems != 0) {
        return fail(r, RM_E_FORMAT, "tensor '%s' of type %s has ne[0] = %" PRId64 ", not a "
                    "multiple of the block size %" PRId32, name.s, ts->name, t->ne[0], ts->block_elems);
    }
    uint64_t nbytes = (uint64_t) ts->block_bytes;
    for (int d = 0; d < 4; d++) {
        const uint64_t n = (uint64_t) (d == 0 ? t->ne[0] / ts->block_elems : t->ne[d]);
        if (__builtin_mul_overflow(nbytes, n, &nbytes)) {
            return fail(r, RM_E_FORMAT, "tensor '%s' is too large: its size in bytes overflows "
                        "64 bits", name.s);
        }
    }
    t->nbytes = nbytes;
    if (!read_u64(r, &t->offset)) {
        return truncated(r, 8, "the offset of tensor '%s'", name.s);
    }
    return RM_OK;
}

static rm_status parse_tensor_infos(reader * r) {
    rm_gguf * g = r->g;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        tensor_rec * t = &g->tensors[i];
        uint64_t len;
        if (!read_len(r, &len)) {
            return truncated(r, 8, "the name length of tensor %" PRId64, i);
        }
        if (len > bytes_left(r)) {
            return truncated(r, len, "the name of tensor %" PRId64, i);
        }
        t->name = take_str(r, len);
        const quoted name = quote(t->name);
        if (len >= GGUF_MAX_NAME) {
            return fail(r, RM_E_FORMAT, "the name of tensor %" PRId64 " ('%s') is %" PRIu64
                        " bytes long; names must be shorter than %d bytes",
                        i, name.s, len, GGUF_MAX_NAME);
        }
        if (!valid_utf8(t->name)) {
            return fail(r, RM_E_FORMAT, "the name of tensor %" PRId64 " ('%s') is not valid UTF-8 "
                        "or contains a NUL byte", i, name.s);
        }
        const int64_t dup = index_add(&g->tensor_index, i);
        if (dup >= 0) {
            return fail(r, RM_E_FORMAT, "duplicate tensor name '%s' (tensors %" PRId64 " and %"
                        PRId64 ")", name.s, dup, i);
        }
        const rm_status st = parse_tensor_shape(r, t);
        if (st != RM_OK) {
            return st;
        }
    }
    return RM_OK;
}

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) & ~(a - 1); }

/* An offset that is not the expected one: say how the layout is broken. */
static rm_status misplaced(const reader * r, int64_t i, uint64_t expected) {
    const rm_gguf * g = r->g;
    const tensor_rec * t = &g->tensors[i];
    const quoted name = quote(t->name);
    char why[400];
    if (t->offset < expected) {
        snprintf(why, sizeof(why), "it overlaps the data of an earlier tensor");
    } else {
        int64_t later = -1;
        for (int64_t j = i + 1; j < g->n_tensors && later < 0; j++) {
            later = g->tensors[j].offset == expected ? j : -1;
        }
        if (later >= 0) {
            snprintf(why, sizeof(why), "out of order: tensor '%s', listed later, starts there",
                     quote(g->tensors[later].name).s);
        } else {
            snprintf(why, sizeof(why), "it leaves a gap of %" PRIu64 " bytes",
                     t->offset - expected);
        }
    }
    return fail(r, RM_E_FORMAT, "tensor '%s' has offset %" PRIu64 ", expected %" PRIu64
                " (tensors must be dense and in order; %s)", name.s, t->offset, expected, why);
}

/* The data section starts at the first aligned byte after the infos (no padding without
 * tensors); each tensor's data follows the previous one's, padded to the alignment. */
static rm_status place_tensors(reader * r) {
    rm_gguf * g = r->g;
    if (g->n_tensors == 0) {
        g->data_offset = r->pos;
        return RM_OK;
    }
    g->data_offset = align_up(r->pos, g->alignment);
    if (g->data_offset > g->size) {
        return fail(r, RM_E_FORMAT, "the data section would start at byte %" PRIu64 " (the end "
                    "of the tensor infos, %" PRIu64 ", padded to %" PRIu32 "), past the end of "
                    "the file (%" PRIu64 " bytes)",
                    g->data_offset, r->pos, g->alignment, g->size);
    }
    const uint64_t avail = g->size - g->data_offset;
    uint64_t expected = 0;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        const tensor_rec * t = &g->tensors[i];
        if (t->offset > avail) {
            return fail(r, RM_E_FORMAT, "tensor '%s' has offset %" PRIu64 ", which points past "
                        "the end of the file (the data section holds %" PRIu64 " bytes)",
                        quote(t->name).s, t->offset, avail);
        }
        if (t->offset != expected) {
            return misplaced(r, i, expected);
        }
        if (t->nbytes > avail - t->offset) {
            return fail(r, RM_E_FORMAT, "truncated file: the data of tensor '%s' (%" PRIu64
                        " bytes at file offset %" PRIu64 ") runs past the end of the file (%"
                        PRIu64 " bytes)", quote(t->name).s, t->nbytes,
                        g->data_offset + t->offset, g->size);
        }
        /* Cannot overflow: offset + nbytes <= avail < 2^63, and the alignment is below 2^32. */
        expected = align_up(t->offset + t->nbytes, g->alignment);
    }
    return RM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Opening
 * ------------------------------------------------------------------------------------------- */

static rm_status parse(reader * r) {
    rm_gguf * g = r->g;
    int64_t n_tensors = 0, n_kv = 0;
    rm_status st = parse_header(r, &n_tensors, &n_kv);
    if (st != RM_OK) {
        return st;
    }
    /* Both counts are bounded by the file size, so these allocations are too. */
    g->kv = calloc((size_t) n_kv + 1, sizeof(kv_rec));
    if (g->kv == NULL || index_init(&g->kv_index, n_kv, g->kv, sizeof(kv_rec)) != RM_OK) {
        return fail(r, RM_E_OOM, "out of memory indexing %" PRId64 " KV pairs", n_kv);
    }
    g->n_kv = n_kv;
    if ((st = parse_kvs(r)) != RM_OK || (st = read_alignment(r)) != RM_OK) {
        return st;
    }
    if ((uint64_t) n_tensors > bytes_left(r) / GGUF_INFO_MIN_BYTES) {
        return fail(r, RM_E_FORMAT,
                    "tensor count %" PRId64 " cannot fit: the %" PRIu64 " bytes after the KV "
                    "pairs hold at most %" PRIu64 " tensor infos of %d bytes or more (corrupt "
                    "count or truncated file)",
                    n_tensors, bytes_left(r), bytes_left(r) / GGUF_INFO_MIN_BYTES,
                    GGUF_INFO_MIN_BYTES);
    }
    g->tensors = calloc((size_t) n_tensors + 1, sizeof(tensor_rec));
    if (g->tensors == NULL ||
        index_init(&g->tensor_index, n_tensors, g->tensors, sizeof(tensor_rec)) != RM_OK) {
        return fail(r, RM_E_OOM, "out of memory indexing %" PRId64 " tensors", n_tensors);
    }
    g->n_tensors = n_tensors;
    g->infos_begin = r->pos;
    if ((st = parse_tensor_infos(r)) != RM_OK) {
        return st;
    }
    g->infos_end = r->pos;
    return place_tensors(r);
}

/* Under AddressSanitizer the file is read into a heap buffer of exactly its size instead of being
 * mapped: ASan does not watch mappings, but it reports any read past the end of a heap block. */
#if defined(__SANITIZE_ADDRESS__)
#define RM_GGUF_READ_TO_HEAP 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RM_GGUF_READ_TO_HEAP 1
#endif
#endif

#define RM_HUGE_PAGE (2u << 20)

static uint64_t huge_len(uint64_t size) { return (size + RM_HUGE_PAGE - 1) / RM_HUGE_PAGE * RM_HUGE_PAGE; }

static void unmap_file(const uint8_t * map, uint64_t size, int read) {
#ifdef RM_GGUF_READ_TO_HEAP
    (void) size, (void) read;
    free((void *) map);
#else
    munmap((void *) map, (size_t) (read ? huge_len(size) : size));
#endif
}

#ifndef RM_GGUF_READ_TO_HEAP
/* The file read whole into anonymous memory aligned to 2 MiB, which the kernel backs with huge
 * pages where it has them (MADV_HUGEPAGE), then made read-only like a mapping. */
static rm_status read_contents(const char * path, int fd, uint64_t size, const uint8_t ** map) {
    const uint64_t len = huge_len(size);
    uint8_t * q = mmap(NULL, (size_t) (len + RM_HUGE_PAGE), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (q == MAP_FAILED) {
        return rm_fail(RM_E_OOM, "rm_gguf_open: %s: no memory to read %" PRIu64 " bytes: %s", path, size, strerror(errno));
    }
    uint8_t * a = (uint8_t *) (((uintptr_t) q + RM_HUGE_PAGE - 1) / RM_HUGE_PAGE * RM_HUGE_PAGE);
    if (a > q) {
        munmap(q, (size_t) (a - q));
    }
    munmap(a + len, (size_t) (q + len + RM_HUGE_PAGE - (a + len)));
#ifdef MADV_HUGEPAGE
    madvise(a, (size_t) len, MADV_HUGEPAGE);
#endif
    for (uint64_t done = 0; done < size;) {
        const ssize_t n = pread(fd, a + done, (size_t) (size - done), (off_t) done);
        if (n <= 0 && !(n < 0 && errno == EINTR)) {
            const int err = errno;
            munmap(a, (size_t) len);
            return rm_fail(RM_E_IO, "rm_gguf_open: %s: read failed at byte %" PRIu64 ": %s", path, done,
                           n == 0 ? "unexpected end of file" : strerror(err));
        }
        done += n > 0 ? (uint64_t) n : 0;
    }
    mprotect(a, (size_t) len, PROT_READ);
    *map = a;
    return RM_OK;
}

#ifdef __linux__
/* A memory cgroup's files: v2 keeps them in the group's folder, v1 under the memory controller's
 * own hierarchy. Page cache counts towards the usage, but the kernel reclaims its inactive part
 * before it kills, so that part is room (as MemAvailable counts it). */
typedef struct cgroup_files {
    const char * controller;  /* the controller named in /proc/self/cgroup: "" for v2's "0::" line */
    const char * sub;         /* the hierarchy's folder under the cgroup root */
    const char * limit, * usage, * inactive_key;
} cgroup_files;

static const cgroup_files CGROUP_V2 = {"", "", "memory.max", "memory.current", "inactive_file"};
static const cgroup_files CGROUP_V1 = {"memory", "/memory", "memory.limit_in_bytes", "memory.usage_in_bytes",
                                       "total_inactive_file"};

enum { CGROUP_PATH_MAX = 4096, CGROUP_DIR_MAX = 2 * CGROUP_PATH_MAX + 64 };   /* root + group */

static const char * cgroup_root(void) {
    const char * root = getenv("RAPIDMOE_CGROUP_ROOT");   /* a testing hook: a fake tree */
    return root && *root ? root : "/sys/fs/cgroup";
}

/* The number in dir/name, or after "key " on one of its lines when key is given. 0 when the
 * file or the key is missing or holds no number (v2's "max": no limit). */
static int cgroup_value(const char * dir, const char * name, const char * key, uint64_t * out) {
    char path[CGROUP_DIR_MAX + 64], line[256];
    if ((size_t) snprintf(path, sizeof(path), "%s/%s", dir, name) >= sizeof(path)) {
        return 0;
    }
    FILE * f = fopen(path, "r");
    if (f == NULL) {
        return 0;
    }
    const size_t n = key ? strlen(key) : 0;
    unsigned long long v = 0;
    int found = 0;
    while (!found && fgets(line, sizeof(line), f)) {
        if (key == NULL) {
            found = sscanf(line, "%llu", &v) == 1;
            break;
        }
        found = !strncmp(line, key, n) && line[n] == ' ' && sscanf(line + n + 1, "%llu", &v) == 1;
    }
    fclose(f);
    *out = (uint64_t) v;
    return found;
}

/* The room under the limit of the group in dir: UINT64_MAX without a limit there. */
static uint64_t cgroup_room_in(const char * dir, const cgroup_files * k) {
    uint64_t limit, usage = 0, inactive = 0;
    if (!cgroup_value(dir, k->limit, NULL, &limit)) {
        return UINT64_MAX;
    }
    cgroup_value(dir, k->usage, NULL, &usage);
    cgroup_value(dir, "memory.stat", k->inactive_key, &inactive);
    const uint64_t used = usage > inactive ? usage - inactive : 0;
    return limit > used ? limit - used : 0;
}

/* 1 when the comma-separated list names controller; v2's line has an empty list. */
static int names_controller(const char * list, const char * controller) {
    const size_t n = strlen(controller);
    if (n == 0) {
        return *list == '\0';
    }
    for (const char * c = list;; c++) {
        if (!strncmp(c, controller, n) && (c[n] == ',' || c[n] == '\0')) {
            return 1;
        }
        if ((c = strchr(c, ',')) == NULL) {
            return 0;
        }
    }
}

/* This process's group in k's hierarchy ("/a/b", from its line "id:controllers:/a/b" in
 * /proc/self/cgroup) into path; "" (the root) without such a line. */
static void own_cgroup(const cgroup_files * k, char * path, size_t size) {
    char line[CGROUP_PATH_MAX + 256];
    path[0] = '\0';
    FILE * f = fopen("/proc/self/cgroup", "r");
    if (f == NULL) {
        return;
    }
    while (fgets(line, sizeof(line), f)) {
        char * list = strchr(line, ':');
        char * group = list ? strchr(list + 1, ':') : NULL;
        if (group == NULL) {
            continue;
        }
        *group++ = '\0';
        group[strcspn(group, "\n")] = '\0';
        if (names_controller(list + 1, k->controller) && strlen(group) < size) {
            strcpy(path, group);
            break;
        }
    }
    fclose(f);
}

/* The least room under the limits of this process's group and of every group above it (a
 * parent's limit binds its children; and where a container shows a host path that its own
 * tree lacks, the search ends at the root, the container's group): UINT64_MAX without any. */
static uint64_t cgroup_room(const cgroup_files * k) {
    char dir[CGROUP_DIR_MAX], group[CGROUP_PATH_MAX];
    own_cgroup(k, group, sizeof(group));
    const int top = snprintf(dir, sizeof(dir), "%s%s", cgroup_root(), k->sub);
    if (top < 0 || (size_t) top + strlen(group) >= sizeof(dir)) {
        return UINT64_MAX;
    }
    strcpy(dir + top, group);
    uint64_t room = cgroup_room_in(dir, k);
    for (char * slash; (slash = strrchr(dir + top, '/')) != NULL;) {
        *slash = '\0';
        const uint64_t r = cgroup_room_in(dir, k);
        room = r < room ? r : room;
    }
    return room;
}

static uint64_t memory_limit_room(void) {
    const uint64_t v2 = cgroup_room(&CGROUP_V2), v1 = cgroup_room(&CGROUP_V1);
    return v2 < v1 ? v2 : v1;
}
#else
static uint64_t memory_limit_room(void) { return UINT64_MAX; }   /* cgroups are Linux's */
#endif

/* The memory this process may still take: /proc/meminfo's MemAvailable, or less under a memory
 * cgroup's limit (a container's), since taking more than that gets the process killed. */
uint64_t rm_memory_room(void) {
    char buf[128];
    unsigned long long avail_kib = 0;
    FILE * f = fopen("/proc/meminfo", "r");
    if (f != NULL) {
        while (fgets(buf, sizeof(buf), f)) {
            if (sscanf(buf, "MemAvailable: %llu kB", &avail_kib) == 1) {
                break;
            }
        }
        fclose(f);
    }
    const uint64_t avail = avail_kib ? (uint64_t) avail_kib * 1024 : UINT64_MAX;
    const uint64_t room = memory_limit_room();
    return room < avail ? room : avail;
}

/* RM_LOAD_AUTO's choice: read when the kernel gives huge pages on request and the file takes at
 * most three quarters of the memory the process may take (rm_memory_room). */
static int read_pays(uint64_t size) {
    char buf[128] = {0};
    FILE * f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    const int huge = f && fgets(buf, sizeof(buf), f) && !strstr(buf, "[never]");
    if (f) {
        fclose(f);
    }
    return huge && size <= rm_memory_room() / 4 * 3;
}
#else
uint64_t rm_memory_room(void) { return UINT64_MAX; }   /* the sanitizer build reads every file to the heap */
#endif

static rm_status map_contents(const char * path, int fd, uint64_t size, const uint8_t ** map) {
#ifdef RM_GGUF_READ_TO_HEAP
    uint8_t * p = malloc((size_t) size);
    if (p == NULL) {
        return rm_fail(RM_E_OOM, "rm_gguf_open: %s: out of memory reading %" PRIu64 " bytes",
                       path, size);
    }
    for (uint64_t done = 0; done < size;) {
        const ssize_t n = pread(fd, p + done, (size_t) (size - done), (off_t) done);
        if (n <= 0 && !(n < 0 && errno == EINTR)) {
            free(p);
            return rm_fail(RM_E_IO, "rm_gguf_open: %s: read failed at byte %" PRIu64 ": %s",
                           path, done, n == 0 ? "unexpected end of file" : strerror(errno));
        }
        done += n > 0 ? (uint64_t) n : 0;
    }
    *map = p;
#else
    void * p = mmap(NULL, (size_t) size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
        return rm_fail(RM_E_IO, "rm_gguf_open: %s: mmap of %" PRIu64 " bytes failed: %s",
                       path, size, strerror(errno));
    }
    *map = p;
#endif
    return RM_OK;
}

/* Opens path, checks it is a non-empty regular file, and maps it read-only. */
static rm_status map_file(const char * path, int32_t load, const uint8_t ** map, uint64_t * size, int * read, int * keep) {
    /* O_NONBLOCK: opening a FIFO must not hang; it is refused below as not a regular file. */
    const int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        return rm_fail(RM_E_IO, "rm_gguf_open: %s: cannot open: %s", path, strerror(errno));
    }
    struct stat sb;
    rm_status st = RM_OK;
    if (fstat(fd, &sb) != 0) {
        st = rm_fail(RM_E_IO, "rm_gguf_open: %s: cannot stat: %s", path, strerror(errno));
    } else if (S_ISDIR(sb.st_mode)) {
        st = rm_fail(RM_E_IO, "rm_gguf_open: %s: is a directory, not a GGUF file", path);
    } else if (!S_ISREG(sb.st_mode)) {
        st = rm_fail(RM_E_IO, "rm_gguf_open: %s: not a regular file", path);
    } else if (sb.st_size == 0) {
        st = rm_fail(RM_E_FORMAT, "rm_gguf_open: %s: the file is empty (0 bytes), not a GGUF "
                     "file", path);
    } else if ((uint64_t) sb.st_size > SIZE_MAX) {
        st = rm_fail(RM_E_IO, "rm_gguf_open: %s: %" PRIu64 " bytes do not fit in the address "
                     "space", path, (uint64_t) sb.st_size);
    } else {
        *size = (uint64_t) sb.st_size;
#ifndef RM_GGUF_READ_TO_HEAP
        *read = load == RM_LOAD_READ || (load == RM_LOAD_AUTO && read_pays(*size));
        st = *read ? read_contents(path, fd, *size, map) : map_contents(path, fd, *size, map);
        if (st == RM_E_OOM && *read && load == RM_LOAD_AUTO) {   /* no room after all: map it */
            rm_clear_error();
            *read = 0;
            st = map_contents(path, fd, *size, map);
        }
#else
        (void) load;
        *read = 0;
        st = map_contents(path, fd, *size, map);
#endif
    }
    *keep = st == RM_OK && *read ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
    close(fd);
    return st;
}

rm_status rm_gguf_open(const char * path, rm_gguf ** out) { return rm_gguf_open_load(path, RM_LOAD_MMAP, out); }

int rm_gguf_give_back(const rm_gguf * g, const void * p, uint64_t bytes) {
    if ((const uint8_t *) p < g->map || (uint64_t) ((const uint8_t *) p - g->map) + bytes > g->size) {
        return 0;   /* not this file's bytes */
    }
#ifdef RM_GGUF_READ_TO_HEAP
    (void) bytes;   /* a heap copy: released pages would read back as zeros; keep them */
#else
    const uintptr_t page = (uintptr_t) sysconf(_SC_PAGESIZE);
    const uintptr_t lo = ((uintptr_t) p + page - 1) / page * page, hi = ((uintptr_t) p + bytes) / page * page;
    if (hi <= lo) {
        return 1;
    }
    if (!g->read) {   /* a mapping's released pages read back from the file */
        madvise((void *) lo, (size_t) (hi - lo), MADV_DONTNEED);
    } else if (g->fd >= 0) {
        /* a read copy's would read back as zeros: map the file over them instead (the copy is
         * 2 MiB aligned at the file's byte 0, so lo's file offset is page-aligned too) */
        mmap((void *) lo, (size_t) (hi - lo), PROT_READ, MAP_PRIVATE | MAP_FIXED, g->fd, (off_t) (lo - (uintptr_t) g->map));
    }
#endif
    return 1;
}

const uint8_t * rm_gguf_map(const rm_gguf * g) { return g->map; }

uint64_t rm_gguf_size(const rm_gguf * g) { return g->size; }

static int by_start(const void * a, const void * b) {
    const rm_byte_range * x = a, * y = b;
    return x->p < y->p ? -1 : x->p > y->p;
}

/* Replaces the mapping's pages of [lo, hi) (page-aligned) with anonymous pages holding the same
 * bytes, read from fd. */
static rm_status make_anonymous(const char * path, int fd, const uint8_t * map, uintptr_t lo, uintptr_t hi) {
    void * p = mmap((void *) lo, hi - lo, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (p == MAP_FAILED) {
        return rm_fail(RM_E_OOM, "rm_model_load: %s: no memory for %" PRIu64 " resident bytes: %s", path,
                       (uint64_t) (hi - lo), strerror(errno));
    }
    const uint64_t off = (uint64_t) (lo - (uintptr_t) map);
    for (uint64_t done = 0; done < hi - lo;) {
        const ssize_t n = pread(fd, (uint8_t *) lo + done, (size_t) (hi - lo - done), (off_t) (off + done));
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {   /* past the end of the file: the last page's tail stays zero, as a mapping's */
            if (n < 0) {
                return rm_fail(RM_E_IO, "rm_model_load: %s: read failed at byte %" PRIu64 ": %s", path, off + done,
                               strerror(errno));
            }
            break;
        }
        done += (uint64_t) n;
    }
    mprotect((void *) lo, hi - lo, PROT_READ);
#ifdef POSIX_FADV_DONTNEED
    posix_fadvise(fd, (off_t) off, (off_t) (hi - lo), POSIX_FADV_DONTNEED);   /* the copy is all we keep */
#endif
    return RM_OK;
}

rm_status rm_gguf_keep_resident(rm_gguf * g, const char * path, rm_byte_range * skip, int64_t n_skip) {
#if defined(RM_GGUF_READ_TO_HEAP) || !defined(__linux__)
    (void) g, (void) path, (void) skip, (void) n_skip;
    return RM_OK;
#else
    if (g->read) {
        return RM_OK;
    }
    const uintptr_t page = (uintptr_t) sysconf(_SC_PAGESIZE), base = (uintptr_t) g->map;
    const uintptr_t end = (base + g->size + page - 1) / page * page;
    qsort(skip, (size_t) n_skip, sizeof(*skip), by_start);
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return rm_fail(RM_E_IO, "rm_model_load: %s: cannot open: %s", path, strerror(errno));
    }
    rm_status st = RM_OK;
    uintptr_t at = base;   /* the pages from here on are not handled yet */
    for (int64_t j = 0; j <= n_skip && st == RM_OK; j++) {
        /* the pages wholly inside a skipped range stay mapped; the others up to it become resident */
        uintptr_t s_lo = end, s_hi = end;
        if (j < n_skip) {
            s_lo = ((uintptr_t) skip[j].p + page - 1) / page * page;
            s_hi = ((uintptr_t) skip[j].p + skip[j].bytes) / page * page;
            if (s_hi <= s_lo) {
                continue;
            }
#ifdef MADV_RANDOM
            madvise((void *) s_lo, s_hi - s_lo, MADV_RANDOM);   /* a stray touch reads its page, not 8 MiB around it */
#endif
        }
        if (s_lo > at) {
            st = make_anonymous(path, fd, g->map, at, s_lo);
        }
        at = s_hi > at ? s_hi : at;
    }
    close(fd);
    return st;
#endif
}

rm_status rm_gguf_open_load(const char * path, int32_t load, rm_gguf ** out) {
    rm_clear_error();
    if (out == NULL) {
        return rm_fail(RM_E_INVALID_ARG, "rm_gguf_open: out is NULL");
    }
    *out = NULL;
    if (path == NULL) {
        return rm_fail(RM_E_INVALID_ARG, "rm_gguf_open: path is NULL");
    }
    const uint8_t * map = NULL;
    uint64_t size = 0;
    int read = 0, fd = -1;
    rm_status st = map_file(path, load, &map, &size, &read, &fd);
    if (st != RM_OK) {
        return st;
    }
    rm_gguf * g = calloc(1, sizeof(rm_gguf));
    if (g == NULL) {
        unmap_file(map, size, read);
        if (fd >= 0) close(fd);
        return rm_fail(RM_E_OOM, "rm_gguf_open: %s: out of memory", path);
    }
    g->map  = map;
    g->size = size;
    g->read = read;
    g->fd   = fd;
    reader r = {g, path, 0};
    if ((st = parse(&r)) != RM_OK) {
        rm_gguf_close(g);
        return st;
    }
    *out = g;
    return RM_OK;
}

void rm_gguf_close(rm_gguf * g) {
    if (g == NULL) {
        return;
    }
    if (g->kv != NULL) {
        for (int64_t i = 0; i < g->n_kv; i++) {
            free(g->kv[i].str_offs);
        }
    }
    free(g->kv);
    free(g->kv_index.slots);
    free(g->tensors);
    free(g->tensor_index.slots);
    if (g->map != NULL) {
        unmap_file(g->map, g->size, g->read);
    }
    if (g->fd >= 0) {
        close(g->fd);
    }
    free(g);
}

/* ---------------------------------------------------------------------------------------------
 * Accessors: O(1) reads of what rm_gguf_open indexed
 * ------------------------------------------------------------------------------------------- */

uint32_t rm_gguf_version(const rm_gguf * g)     { return g ? g->version : 0; }
uint32_t rm_gguf_alignment(const rm_gguf * g)   { return g ? g->alignment : 0; }
uint64_t rm_gguf_data_offset(const rm_gguf * g) { return g ? g->data_offset : 0; }
uint64_t rm_gguf_infos_begin(const rm_gguf * g) { return g ? g->infos_begin : 0; }
uint64_t rm_gguf_infos_end(const rm_gguf * g) { return g ? g->infos_end : 0; }
uint64_t rm_gguf_file_size(const rm_gguf * g)   { return g ? g->size : 0; }
int64_t  rm_gguf_n_kv(const rm_gguf * g)        { return g ? g->n_kv : 0; }
int64_t  rm_gguf_n_tensors(const rm_gguf * g)   { return g ? g->n_tensors : 0; }

static const kv_rec * kv_at(const rm_gguf * g, int64_t i) {
    return g != NULL && i >= 0 && i < g->n_kv ? &g->kv[i] : NULL;
}

int64_t rm_gguf_find_kv(const rm_gguf * g, const char * key) {
    return g && key ? index_find(&g->kv_index, key, strlen(key)) : -1;
}

rm_str rm_gguf_kv_key(const rm_gguf * g, int64_t i) {
    const kv_rec * kv = kv_at(g, i);
    rm_str none = {NULL, 0};
    return kv ? kv->key : none;
}

int32_t rm_gguf_kv_type(const rm_gguf * g, int64_t i) {
    const kv_rec * kv = kv_at(g, i);
    return kv ? kv->type : -1;
}

int32_t rm_gguf_kv_arr_type(const rm_gguf * g, int64_t i) {
    const kv_rec * kv = kv_at(g, i);
    return kv ? kv->arr_type : -1;
}

uint64_t rm_gguf_kv_arr_n(const rm_gguf * g, int64_t i) {
    const kv_rec * kv = kv_at(g, i);
    return kv ? kv->arr_n : 0;
}

const void * rm_gguf_kv_data(const rm_gguf * g, int64_t i) {
    const kv_rec * kv = kv_at(g, i);
    if (kv == NULL || kv->type == RM_GGUF_STRING) {
        return NULL;
    }
    if (kv->type == RM_GGUF_ARRAY && (kv->arr_type == RM_GGUF_STRING || kv->arr_n == 0)) {
        return NULL;
    }
    return g->map + kv->val_off;
}

rm_str rm_gguf_kv_str(const rm_gguf * g, int64_t i) {
    const kv_rec * kv = kv_at(g, i);
    rm_str s = {NULL, 0};
    if (kv != NULL && kv->type == RM_GGUF_STRING) {
        s.ptr = (const char *) g->map + kv->val_off;
        s.len = kv->str_len;
    }
    return s;
}

rm_str rm_gguf_kv_arr_str(const rm_gguf * g, int64_t i, uint64_t j) {
    const kv_rec * kv = kv_at(g, i);
    rm_str s = {NULL, 0};
    if (kv == NULL || kv->type != RM_GGUF_ARRAY || kv->arr_type != RM_GGUF_STRING || j >= kv->arr_n) {
        return s;
    }
    const uint64_t at = kv->val_off + (kv->str_offs_wide ? ((const uint64_t *) kv->str_offs)[j]
                                                         : ((const uint32_t *) kv->str_offs)[j]);
    memcpy(&s.len, g->map + at, 8);
    s.ptr = (const char *) g->map + at + 8;
    return s;
}

int64_t rm_gguf_find_tensor(const rm_gguf * g, const char * name) {
    return g && name ? index_find(&g->tensor_index, name, strlen(name)) : -1;
}

rm_status rm_gguf_tensor_info(const rm_gguf * g, int64_t i, rm_tensor_info * out) {
    rm_clear_error();
    if (g == NULL || out == NULL) {
        return rm_fail(RM_E_INVALID_ARG, "rm_gguf_tensor_info: %s is NULL", g ? "out" : "g");
    }
    if (i < 0 || i >= g->n_tensors) {
        return rm_fail(RM_E_INVALID_ARG, "rm_gguf_tensor_info: index %" PRId64 " is out of range "
                       "(the file has %" PRId64 " tensors)", i, g->n_tensors);
    }
    const tensor_rec * t = &g->tensors[i];
    out->name   = t->name;
    out->type   = t->type;
    out->n_dims = t->n_dims;
    memcpy(out->ne, t->ne, sizeof(out->ne));
    out->offset = t->offset;
    out->nbytes = t->nbytes;
    out->data   = g->map + g->data_offset + t->offset;
    return RM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Typed getters for the model loader (gguf.h)
 * ------------------------------------------------------------------------------------------- */

static rm_status find_typed(const rm_gguf * g, const char * fn, const char * key,
                            const kv_rec ** out) {
    RM_ASSERT(g != NULL && key != NULL);
    rm_clear_error();
    const int64_t i = rm_gguf_find_kv(g, key);
    if (i < 0) {
        return rm_fail(RM_GGUF_MISSING, "%s: key '%s' not found", fn, key);
    }
    *out = &g->kv[i];
    return RM_OK;
}

/* An integer kv of any width as (negative?, value): signed values in *s, the rest in *u. */
static bool kv_integer(const rm_gguf * g, const kv_rec * kv, bool * neg, int64_t * s, uint64_t * u) {
    const uint8_t * p = g->map + kv->val_off;
    *neg = false;
    *s = 0;
    *u = 0;
    switch (kv->type) {
        case RM_GGUF_UINT8:  { uint8_t  v; memcpy(&v, p, 1); *u = v; return true; }
        case RM_GGUF_UINT16: { uint16_t v; memcpy(&v, p, 2); *u = v; return true; }
        case RM_GGUF_UINT32: { uint32_t v; memcpy(&v, p, 4); *u = v; return true; }
        case RM_GGUF_UINT64: { uint64_t v; memcpy(&v, p, 8); *u = v; return true; }
        case RM_GGUF_INT8:   { int8_t   v; memcpy(&v, p, 1); *s = v; break; }
        case RM_GGUF_INT16:  { int16_t  v; memcpy(&v, p, 2); *s = v; break; }
        case RM_GGUF_INT32:  { int32_t  v; memcpy(&v, p, 4); *s = v; break; }
        case RM_GGUF_INT64:  { int64_t  v; memcpy(&v, p, 8); *s = v; break; }
        default: return false;
    }
    *neg = *s < 0;
    *u = *neg ? 0 : (uint64_t) *s;
    return true;
}

/* Reads key as an integer within [lo, hi] (lo is 0 or negative, hi non-negative). */
static rm_status get_integer(const rm_gguf * g, const char * fn, const char * key, const char * ctype,
                             int64_t lo, uint64_t hi, int64_t * s_out, uint64_t * u_out) {
    const kv_rec * kv = NULL;
    rm_status st = find_typed(g, fn, key, &kv);
    if (st != RM_OK) {
        return st;
    }
    bool neg;
    if (!kv_integer(g, kv, &neg, s_out, u_out)) {
        return rm_fail(RM_E_FORMAT, "%s: key '%s' has type %s, expected an integer", fn, key,
                       gguf_value_name[kv->type]);
    }
    if (neg ? *s_out < lo : *u_out > hi) {
        if (neg) {
            return rm_fail(RM_E_FORMAT, "%s: key '%s' has value %" PRId64 ", which does not fit "
                           "in %s", fn, key, *s_out, ctype);
        }
        return rm_fail(RM_E_FORMAT, "%s: key '%s' has value %" PRIu64 ", which does not fit in %s",
                       fn, key, *u_out, ctype);
    }
    return RM_OK;
}

rm_status rm_gguf_get_u32(const rm_gguf * g, const char * key, uint32_t * out) {
    int64_t s;
    uint64_t u;
    const rm_status st = get_integer(g, __func__, key, "uint32", 0, UINT32_MAX, &s, &u);
    if (st == RM_OK) *out = (uint32_t) u;
    return st;
}

rm_status rm_gguf_get_i32(const rm_gguf * g, const char * key, int32_t * out) {
    int64_t s;
    uint64_t u;
    const rm_status st = get_integer(g, __func__, key, "int32", INT32_MIN, INT32_MAX, &s, &u);
    if (st == RM_OK) *out = s < 0 ? (int32_t) s : (int32_t) u;
    return st;
}

rm_status rm_gguf_get_u64(const rm_gguf * g, const char * key, uint64_t * out) {
    int64_t s;
    uint64_t u;
    const rm_status st = get_integer(g, __func__, key, "uint64", 0, UINT64_MAX, &s, &u);
    if (st == RM_OK) *out = u;
    return st;
}

rm_status rm_gguf_get_i64(const rm_gguf * g, const char * key, int64_t * out) {
    int64_t s;
    uint64_t u;
    const rm_status st = get_integer(g, __func__, key, "int64", INT64_MIN, INT64_MAX, &s, &u);
    if (st == RM_OK) *out = s < 0 ? s : (int64_t) u;
    return st;
}

rm_status rm_gguf_get_f32(const rm_gguf * g, const char * key, float * out) {
    const kv_rec * kv = NULL;
    const rm_status st = find_typed(g, __func__, key, &kv);
    if (st != RM_OK) {
        return st;
    }
    if (kv->type == RM_GGUF_FLOAT32) {
        memcpy(out, g->map + kv->val_off, 4);
    } else if (kv->type == RM_GGUF_FLOAT64) {
        double d;
        memcpy(&d, g->map + kv->val_off, 8);
        *out = (float) d;
    } else {
        return rm_fail(RM_E_FORMAT, "%s: key '%s' has type %s, expected f32 or f64", __func__, key,
                       gguf_value_name[kv->type]);
    }
    return RM_OK;
}

rm_status rm_gguf_get_bool(const rm_gguf * g, const char * key, bool * out) {
    const kv_rec * kv = NULL;
    const rm_status st = find_typed(g, __func__, key, &kv);
    if (st != RM_OK) {
        return st;
    }
    if (kv->type != RM_GGUF_BOOL) {
        return rm_fail(RM_E_FORMAT, "%s: key '%s' has type %s, expected bool", __func__, key,
                       gguf_value_name[kv->type]);
    }
    *out = g->map[kv->val_off] != 0;
    return RM_OK;
}

rm_status rm_gguf_get_str(const rm_gguf * g, const char * key, rm_str * out) {
    const kv_rec * kv = NULL;
    const rm_status st = find_typed(g, __func__, key, &kv);
    if (st != RM_OK) {
        return st;
    }
    if (kv->type != RM_GGUF_STRING) {
        return rm_fail(RM_E_FORMAT, "%s: key '%s' has type %s, expected str", __func__, key,
                       gguf_value_name[kv->type]);
    }
    out->ptr = (const char *) g->map + kv->val_off;
    out->len = kv->str_len;
    return RM_OK;
}

rm_status rm_gguf_get_arr(const rm_gguf * g, const char * key, int32_t elem_type, rm_gguf_arr * out) {
    const kv_rec * kv = NULL;
    const rm_status st = find_typed(g, __func__, key, &kv);
    if (st != RM_OK) {
        return st;
    }
    if (kv->type != RM_GGUF_ARRAY) {
        return rm_fail(RM_E_FORMAT, "%s: key '%s' has type %s, expected an array", __func__, key,
                       gguf_value_name[kv->type]);
    }
    if (elem_type >= 0 && kv->arr_type != elem_type) {
        return rm_fail(RM_E_FORMAT, "%s: key '%s' is an array of %s, expected an array of %s",
                       __func__, key, gguf_value_name[kv->arr_type], rm_gguf_type_name(elem_type));
    }
    out->kv   = kv - g->kv;
    out->type = kv->arr_type;
    out->n    = kv->arr_n;
    out->data = rm_gguf_kv_data(g, out->kv);
    return RM_OK;
}

rm_status rm_gguf_tensor_by_name(const rm_gguf * g, const char * name, rm_tensor_info * out) {
    RM_ASSERT(g != NULL && name != NULL && out != NULL);
    const int64_t i = rm_gguf_find_tensor(g, name);
    if (i < 0) {
        rm_clear_error();
        return rm_fail(RM_GGUF_MISSING, "%s: no tensor named '%s'", __func__, name);
    }
    return rm_gguf_tensor_info(g, i, out);
}
