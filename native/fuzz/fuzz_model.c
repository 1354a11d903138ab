/* fuzz_model.c - libFuzzer target: the model loader on a base file and a residual sidecar.
 *
 * Input: a little-endian u32 n, then the base file, then the sidecar.
 *   n >= the bytes after the header: all of them are the base, loaded without a sidecar;
 *   otherwise the first n bytes are the base and the rest is the sidecar.
 * The seeds (make_seeds.c) are tiny models of each architecture written this way, so mutations
 * reach the loader's checks of keys, shapes and types, not only the reader's.
 *
 * The loader promises that the forward pass needs no checks of its own (model.c), so a model it
 * accepts is also run: a session of a few positions, a two-token prefill and one decoded token,
 * with every residual applied when there is a sidecar. Any out-of-bounds read there is a shape
 * the loader should have refused.
 *
 * Besides libFuzzer's byte mutations, the base's or the sidecar's tensors are dropped, renamed and
 * swapped (gguf_mutate.h): a feature's tensor gone while the others stay must be refused too. */
#include "fuzz_file.h"
#include "gguf_mutate.h"
#include "rapidmoe.h"

#include <string.h>

static void run(rm_model * m) {
    rm_model_info info;
    if (rm_model_info_get(m, &info) != RM_OK) {
        abort();
    }
    rm_session_params sp = {sizeof(rm_session_params), 4, 2};
    rm_session * s = NULL;
    if (rm_session_new(m, &sp, &s) != RM_OK) {
        return;                                  /* e.g. a context too large to allocate: a status */
    }
    if (info.has_residual) {
        rm_residual_policy pol = {0};
        pol.struct_size = sizeof(pol);
        pol.kind = RM_POLICY_ALL;
        if (rm_session_set_policy(s, &pol) != RM_OK) {
            abort();
        }
    }
    float * logits = malloc(sizeof(float) * (size_t) info.n_vocab);
    const int32_t prompt[2] = {0, info.n_vocab - 1};
    if (logits && rm_session_eval(s, prompt, 2, 0, NULL, 0) == RM_OK) {
        const int32_t next = info.n_vocab / 2;
        (void) rm_session_eval(s, &next, 1, 0, logits, (uint64_t) info.n_vocab);
    }
    free(logits);
    rm_session_free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    static fuzz_file base_file, residual_file;
    if (size < 4) {
        return 0;
    }
    uint32_t n;
    memcpy(&n, data, 4);
    data += 4;
    size -= 4;
    const size_t n_base = n < size ? n : size;
    rm_model_params params = {0};
    params.struct_size = sizeof(params);
    params.n_threads = 1;
    const char * base = fuzz_file_set(&base_file, "fuzz.gguf", data, n_base);
    if (n_base < size) {
        params.residual_path = fuzz_file_set(&residual_file, "fuzz.residual.gguf", data + n_base, size - n_base);
    }
    rm_model * m = NULL;
    const rm_status st = rm_model_load(base, &params, &m);
    if (fuzz_verbose()) {
        fprintf(stderr, "fuzz_model: base %zu bytes, sidecar %zu: %s %s\n", n_base, size - n_base,
                rm_status_str(st), rm_last_error());
    }
    if (st != RM_OK) {
        if (m != NULL || rm_last_error()[0] == '\0') {
            abort();                             /* a failure leaves no handle, and says why */
        }
        return 0;
    }
    run(m);
    rm_model_free(m);
    return 0;
}

/* A quarter of the inputs: one structural mutation of the base or of the sidecar, the length
 * prefix and the sidecar's place kept right; the rest: libFuzzer's byte mutations of the whole. */
size_t LLVMFuzzerCustomMutator(uint8_t * data, size_t size, size_t max_size, unsigned int seed) {
    const uint64_t r = gm_draw(seed);
    if (size < 4 || r % 4 != 0) {
        return LLVMFuzzerMutate(data, size, max_size);
    }
    uint32_t n;
    memcpy(&n, data, 4);
    const size_t rest = size - 4, n_base = n < rest ? n : rest;
    const int sidecar = n_base < rest && (r >> 2) % 2;
    uint8_t * file = data + 4 + (sidecar ? n_base : 0);
    const size_t len = sidecar ? rest - n_base : n_base;
    const size_t m = gguf_mutate(file, len, len, r >> 3);
    if (m == 0) {
        return LLVMFuzzerMutate(data, size, max_size);
    }
    if (!sidecar && n_base < rest) {   /* the base shrank: the sidecar follows it */
        memmove(data + 4 + m, data + 4 + n_base, rest - n_base);
        n = (uint32_t) m;
        memcpy(data, &n, 4);
    }
    return size - (len - m);
}
