/* make_seeds.c - the fuzz targets' seed corpus, written at build time (never committed).
 *
 *   make_seeds GGUF_DIR MODEL_DIR
 *
 * Tiny models of each architecture the test helper writes (native/tests/tiny_gguf.h), a few KiB
 * each: their base and sidecar files go to GGUF_DIR as they are, and to MODEL_DIR in fuzz_model's
 * input layout (u32 base length, base, sidecar). tools/fuzz_seeds.py adds files made by the gguf
 * Python package and a trimmed copy of the bundled model. */
#include "../tests/tiny_gguf.h"

#include <errno.h>
#include <unistd.h>

static int read_all(const char * path, tiny_buf * b) {
    FILE * f = fopen(path, "rb");
    if (!f) return -1;
    uint8_t chunk[1 << 16];
    size_t n;
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) tiny_put(b, chunk, n);
    fclose(f);
    return 0;
}

static int write_all(const char * dir, const char * name, const tiny_buf * b) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE * f = fopen(path, "wb");
    const int ok = f && fwrite(b->p, 1, b->n, f) == b->n;
    if (f) fclose(f);
    if (!ok) fprintf(stderr, "make_seeds: cannot write %s: %s\n", path, strerror(errno));
    return ok ? 0 : -1;
}

/* One spec: base (and sidecar) to gguf_dir; the pair, and the base alone, to model_dir. */
static int emit(const tiny_spec * s, const char * tag, const char * gguf_dir, const char * model_dir) {
    char base[256], res[256], name[128];
    snprintf(base, sizeof(base), "%s/%s.gguf", gguf_dir, tag);
    snprintf(res, sizeof(res), "%s/%s.residual.gguf", gguf_dir, tag);
    const int with_res = s->residual_type >= 0;
    if (tiny_write(s, base, with_res ? res : NULL) != 0) {
        fprintf(stderr, "make_seeds: cannot write the model %s\n", tag);
        return -1;
    }
    tiny_buf b = {0}, r = {0}, pair = {0};
    int bad = read_all(base, &b) || (with_res && read_all(res, &r));
    const uint32_t all = UINT32_MAX;
    tiny_u32(&pair, all);
    tiny_put(&pair, b.p, b.n);
    snprintf(name, sizeof(name), "%s.base", tag);
    bad |= write_all(model_dir, name, &pair);
    if (with_res && !bad) {
        pair.n = 0;
        tiny_u32(&pair, (uint32_t) b.n);
        tiny_put(&pair, b.p, b.n);
        tiny_put(&pair, r.p, r.n);
        snprintf(name, sizeof(name), "%s.pair", tag);
        bad |= write_all(model_dir, name, &pair);
    }
    free(b.p);
    free(r.p);
    free(pair.p);
    return bad ? -1 : 0;
}

int main(int argc, char ** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: make_seeds GGUF_DIR MODEL_DIR\n");
        return 2;
    }
    static const char * const archs[] = {"llama", "qwen2moe", "qwen3moe"};
    /* expert base, residual, dense, output; blocks of 32 so that rows of 32 elements fit */
    static const int32_t types[][4] = {
        {RM_TYPE_Q4_0, RM_TYPE_Q8_0, RM_TYPE_Q8_0, RM_TYPE_Q8_0},
        {RM_TYPE_Q8_0, RM_TYPE_F16, RM_TYPE_F16, RM_TYPE_F32},
        {RM_TYPE_Q5_1, -1, RM_TYPE_Q4_1, RM_TYPE_BF16},
    };
    int bad = 0;
    for (size_t a = 0; a < sizeof(archs) / sizeof(archs[0]); a++) {
        for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
            tiny_spec s = tiny_default(archs[a]);
            s.n_embd = 32, s.n_layer = 1 + (int32_t) (t == 0), s.n_head = 2, s.n_head_kv = 1, s.head_dim = 16;
            s.n_expert = 4, s.n_expert_used = 2, s.n_ff = 32, s.n_ff_shexp = 32, s.n_vocab = 16, s.n_ctx = 64;
            s.expert_type = types[t][0], s.residual_type = types[t][1];
            s.dense_type = types[t][2], s.output_type = types[t][3];
            s.seed = 1 + a * 10 + t;
            char tag[64];
            snprintf(tag, sizeof(tag), "%s-%zu", archs[a], t);
            bad |= emit(&s, tag, argv[1], argv[2]);
        }
    }
    return bad ? 1 : 0;
}
