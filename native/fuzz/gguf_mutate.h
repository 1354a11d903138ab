/* gguf_mutate.h - the fuzz targets' structural mutations of a GGUF file: a tensor dropped from the
 * table, a tensor renamed (one character of its name changed), or two tensors' names swapped.
 * Byte mutations alone rarely hit a name so that it still parses, and never remove an entry, so
 * they leave untried what a damaged or hand-edited file does most often: a tensor a feature needs
 * gone while the others of that feature stay (a q norm without its k norm, a bias alone).
 *
 * The file is walked as the format lays it out (header, key/value pairs, tensor infos, the data
 * section at the alignment); a file that does not walk is left to the byte mutations. A drop
 * removes the entry and moves the data section to the new aligned start, so every other tensor's
 * offset (relative to that start) stays valid. */
#ifndef RM_FUZZ_GGUF_MUTATE_H
#define RM_FUZZ_GGUF_MUTATE_H

#include <stdint.h>
#include <string.h>

enum { GM_MAX_TENSORS = 4096 };

typedef struct gm_walk {
    size_t   tensor_at[GM_MAX_TENSORS];   /* each tensor info's first byte (its name's length) */
    size_t   tensor_end[GM_MAX_TENSORS];  /* one past its last byte */
    uint64_t n_tensors;
    size_t   infos_end;                   /* the end of the tensor infos */
    uint64_t alignment;
} gm_walk;

static uint64_t gm_u64(const uint8_t * p) { uint64_t v; memcpy(&v, p, 8); return v; }
static uint32_t gm_u32(const uint8_t * p) { uint32_t v; memcpy(&v, p, 4); return v; }

/* Moves *at past one value of GGUF type t; 0 when it runs past n. */
static int gm_skip_value(const uint8_t * d, size_t n, size_t * at, uint32_t t, int depth) {
    static const uint8_t SIZE[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (t > 12) {
        return 0;
    }
    if (t == 8) {   /* string: u64 length, bytes */
        if (n - *at < 8 || gm_u64(d + *at) > n - *at - 8) return 0;
        *at += 8 + (size_t) gm_u64(d + *at);
        return 1;
    }
    if (t == 9) {   /* array: u32 type, u64 count, values */
        if (depth > 0 || n - *at < 12) return 0;
        const uint32_t et = gm_u32(d + *at);
        const uint64_t count = gm_u64(d + *at + 4);
        *at += 12;
        if (et != 8 && et <= 12 && et != 9) {   /* fixed-size elements at once */
            if (count > (n - *at) / SIZE[et]) return 0;
            *at += (size_t) count * SIZE[et];
            return 1;
        }
        for (uint64_t i = 0; i < count; i++) {
            if (!gm_skip_value(d, n, at, et, depth + 1)) return 0;
        }
        return 1;
    }
    if (n - *at < SIZE[t]) return 0;
    *at += SIZE[t];
    return 1;
}

/* Walks the file's header; 0 when it is not a GGUF file this can walk. */
static int gm_walk_file(const uint8_t * d, size_t n, gm_walk * w) {
    if (n < 24 || memcmp(d, "GGUF", 4) != 0) return 0;
    const uint64_t n_tensors = gm_u64(d + 8), n_kv = gm_u64(d + 16);
    if (n_tensors > GM_MAX_TENSORS || n_kv > n) return 0;
    size_t at = 24;
    w->alignment = 32;
    for (uint64_t i = 0; i < n_kv; i++) {
        const size_t key = at;
        if (!gm_skip_value(d, n, &at, 8, 0) || n - at < 4) return 0;
        const uint32_t t = gm_u32(d + at);
        at += 4;
        const int is_alignment = gm_u64(d + key) == 17 && memcmp(d + key + 8, "general.alignment", 17) == 0;
        if (is_alignment && t == 4 && n - at >= 4) {
            w->alignment = gm_u32(d + at);
        }
        if (!gm_skip_value(d, n, &at, t, 0)) return 0;
    }
    for (uint64_t i = 0; i < n_tensors; i++) {
        w->tensor_at[i] = at;
        if (!gm_skip_value(d, n, &at, 8, 0) || n - at < 4) return 0;
        const uint32_t n_dims = gm_u32(d + at);
        if (n_dims > 4 || n - at < 4 + 8 * (size_t) n_dims + 12) return 0;
        at += 4 + 8 * (size_t) n_dims + 12;   /* dims, type, offset */
        w->tensor_end[i] = at;
    }
    if (w->alignment == 0 || (w->alignment & (w->alignment - 1)) != 0 || w->alignment > 65536) return 0;
    w->n_tensors = n_tensors;
    w->infos_end = at;
    return 1;
}

static size_t gm_align(size_t x, uint64_t a) { return (x + (size_t) a - 1) / (size_t) a * (size_t) a; }

/* One structural mutation of the GGUF file in d[0..n) (capacity cap), chosen by r; returns the new
 * size, or 0 when the file does not walk or has no tensor. */
static size_t gguf_mutate(uint8_t * d, size_t n, size_t cap, uint64_t r) {
    static gm_walk w;
    (void) cap;   /* every mutation keeps or shrinks the size */
    if (!gm_walk_file(d, n, &w) || w.n_tensors == 0) return 0;
    const size_t i = (size_t) ((r >> 8) % w.n_tensors);
    const size_t name = w.tensor_at[i] + 8, len = (size_t) gm_u64(d + w.tensor_at[i]);
    switch (r % 3) {
        case 0: {   /* drop tensor i: the entry out, the data section to its new aligned start */
            const size_t old_data = gm_align(w.infos_end, w.alignment);
            const size_t entry = w.tensor_end[i] - w.tensor_at[i];
            if (old_data > n) return 0;
            memmove(d + w.tensor_at[i], d + w.tensor_end[i], w.infos_end - w.tensor_end[i]);
            const size_t new_end = w.infos_end - entry, new_data = gm_align(new_end, w.alignment);
            memset(d + new_end, 0, new_data - new_end);
            memmove(d + new_data, d + old_data, n - old_data);
            const uint64_t count = w.n_tensors - 1;
            memcpy(d + 8, &count, 8);
            return n - (old_data - new_data);
        }
        case 1: {   /* rename: one character of the name changed to another that names use */
            static const char CHARS[] = "abcdefghijklmnopqrstuvwxyz0123456789._";
            if (len == 0) return 0;
            uint8_t * c = d + name + (size_t) ((r >> 24) % len);
            const uint8_t was = *c;
            *c = (uint8_t) CHARS[(r >> 40) % (sizeof(CHARS) - 1)];
            if (*c == was) *c = was == 'x' ? 'y' : 'x';
            return n;
        }
        default: {  /* swap the names of two tensors of equal name length */
            for (size_t k = 1; k < w.n_tensors; k++) {
                const size_t j = (i + k) % w.n_tensors;
                if ((size_t) gm_u64(d + w.tensor_at[j]) == len && len <= 256) {
                    uint8_t tmp[256];
                    memcpy(tmp, d + name, len);
                    memcpy(d + name, d + w.tensor_at[j] + 8, len);
                    memcpy(d + w.tensor_at[j] + 8, tmp, len);
                    return n;
                }
            }
            return 0;
        }
    }
}

/* libFuzzer's own byte mutations (the custom mutators call them for most inputs) */
size_t LLVMFuzzerMutate(uint8_t * data, size_t size, size_t max_size);

/* The custom mutators' draw: splitmix64's finaliser over libFuzzer's seed. */
static uint64_t gm_draw(unsigned int seed) {
    uint64_t z = (uint64_t) seed * 0x9E3779B97F4A7C15ULL + 0x632BE59BD9B4E019ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* A quarter of the mutations structural (when the file walks), the rest libFuzzer's. */
static size_t gm_mutate_file(uint8_t * d, size_t n, size_t cap, unsigned int seed) {
    const uint64_t r = gm_draw(seed);
    const size_t m = r % 4 == 0 ? gguf_mutate(d, n, cap, r >> 2) : 0;
    return m ? m : LLVMFuzzerMutate(d, n, cap);
}

#endif
