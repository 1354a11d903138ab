/* test_backend_model.c - tiny models end to end: the CPU backend, and where a GPU can be used the
 * CUDA backend and the CPU/GPU split, compared with the CPU.
 *
 * Models are written at test time (tiny_gguf.h): several architectures and weight types, with
 * residual sidecars. Each is run as a 24-token prefill (every position's logits) then 8 decoded
 * tokens, under the residual policies none, all and random(0.3). The CPU is the oracle for the
 * GPU: the CUDA kernels keep activations in fp32 where the CPU rounds them to Q8_0/Q8_K blocks,
 * so the budget is that rounding: per position max |dlogit| <= 1e-3 * max |logit| for F32
 * weights; for quantized weights <= 0.05 and a mean KL divergence <= 1e-3. GPU variants: every
 * expert on the GPU; half the experts kept in host memory; residuals copied to the GPU in
 * prefill (crossover 2 tokens). In decode no weight byte may cross the bus.
 *
 * The same three variants run on the CPU stand-in device (RM_GPU_STANDIN: the split with a second
 * CPU backend as the device) on every machine; its kernels are the CPU's, so its logits must
 * match the CPU's to the order of float sums: max |dlogit| <= 1e-4 * max |logit| per position.
 *
 * Without a usable GPU (this build lacks CUDA, or no device) the GPU part is skipped with the
 * reason, and the CPU part still runs (finite logits; the fallback note is set).
 *
 *   test_backend_model [--json PATH] [--bench [--model BASE.gguf]] [--threads N]
 *
 * --bench also times prefill and decode tokens/s on the CPU, the GPU (no residuals), the split
 * (random residual budget 0.1, and "auto") and the split with half the experts on the CPU, on
 * BASE.gguf (+ its .residual.gguf) or on a generated mid-size model, and writes them to --json. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rapidmoe.h"
#include "expect.h"
#include "tiny_gguf.h"

static int n_skipped;
static char json[1 << 16];
static size_t json_n;


#define JSON(...) (json_n += (size_t) snprintf(json + json_n, sizeof(json) - json_n, __VA_ARGS__))

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + 1e-9 * (double) ts.tv_nsec;
}

enum { N_PROMPT = 24, N_DECODE = 8 };

typedef struct variant {
    const char * name;
    int          use_gpu;
    int          half_experts;            /* odd experts stay in host memory */
    int          upload_min;              /* residual_upload_min_tokens */
} variant;

static rm_model * load(const char * base, const char * res, const variant * v, int n_threads, rm_gpu_info * gi) {
    rm_model_params p = {0};
    p.struct_size = sizeof(p);
    p.n_threads = n_threads;
    p.residual_path = res;
    p.use_gpu = v->use_gpu;
    p.residual_upload_min_tokens = v->upload_min;
    uint8_t * mask = NULL;
    if (v->half_experts) {
        rm_model * probe = NULL;
        rm_model_params q = {sizeof(q), 1, NULL, 0, 0, 0, NULL, 0};
        if (rm_model_load(base, &q, &probe) != RM_OK) return NULL;
        rm_model_info in;
        rm_model_info_get(probe, &in);
        rm_model_free(probe);
        mask = malloc((size_t) in.n_layer * (size_t) in.n_expert);
        for (int i = 0; i < in.n_layer * in.n_expert; i++) mask[i] = (uint8_t) (i % 2 == 0);
        p.expert_on_gpu = mask;
    }
    rm_model * m = NULL;
    rm_status st = rm_model_load(base, &p, &m);
    free(mask);
    if (st != RM_OK) {
        printf("load %s (%s): %s\n", base, v->name, rm_last_error());
        return NULL;
    }
    gi->struct_size = sizeof(*gi);
    rm_model_gpu_info(m, gi);
    return m;
}

/* policy: 0 none, 1 all, 2 random(budget) */
static rm_status set_policy(rm_session * s, int policy, float budget, int n_layer) {
    float lb[64], th[64];
    for (int l = 0; l < n_layer && l < 64; l++) {
        lb[l] = budget;
        th[l] = logf(1.0f - budget);
    }
    rm_residual_policy p = {0};
    p.struct_size = sizeof(p);
    p.kind = policy == 0 ? RM_POLICY_NONE : policy == 1 ? RM_POLICY_ALL : RM_POLICY_RANDOM;
    p.seed = 1234;
    p.gain = 0.2f;
    p.gate_power = 1.0f;
    if (policy == 2) {
        p.layer_budget = lb;
        p.threshold0 = th;
    }
    return rm_session_set_policy(s, &p);
}

/* N_PROMPT tokens as one batch (all logits) then N_DECODE one at a time: (N_PROMPT + N_DECODE) rows. */
static int run(rm_model * m, int policy, int has_res, float * out, int n_vocab, rm_backend_stats * decode_stats) {
    rm_session * s = NULL;
    rm_session_params sp = {sizeof(sp), 64, 32};
    if (rm_session_new(m, &sp, &s) != RM_OK) {
        printf("session: %s\n", rm_last_error());
        return -1;
    }
    rm_model_info in;
    rm_model_info_get(m, &in);
    if (has_res && set_policy(s, policy, 0.3f, in.n_layer) != RM_OK) {
        printf("policy: %s\n", rm_last_error());
        rm_session_free(s);
        return -1;
    }
    int32_t toks[N_PROMPT + N_DECODE];
    for (int i = 0; i < N_PROMPT + N_DECODE; i++) toks[i] = (i * 37 + 11) % n_vocab;
    int rc = rm_session_eval(s, toks, N_PROMPT, 1, out, (uint64_t) N_PROMPT * n_vocab) == RM_OK ? 0 : -1;
    rm_session_clear_stats(s);
    for (int i = 0; rc == 0 && i < N_DECODE; i++) {
        rc = rm_session_eval(s, toks + N_PROMPT + i, 1, 0, out + (uint64_t) (N_PROMPT + i) * n_vocab, n_vocab) == RM_OK ? 0 : -1;
    }
    if (rc) printf("eval: %s\n", rm_last_error());
    if (decode_stats) {
        decode_stats->struct_size = sizeof(*decode_stats);
        rm_session_backend_stats(s, decode_stats);
    }
    rm_session_free(s);
    return rc;
}

typedef struct cmp {
    double max_rel, mean_kl, top1;
    int    finite;
} cmp;

static cmp compare(const float * ref, const float * got, int rows, int n) {
    cmp c = {0, 0, 0, 1};
    for (int r = 0; r < rows; r++) {
        const float * a = ref + (size_t) r * n, * b = got + (size_t) r * n;
        double amax = 0, dmax = 0, ma = -INFINITY, mb = -INFINITY;
        int ia = 0, ib = 0;
        for (int j = 0; j < n; j++) {
            c.finite &= isfinite(a[j]) && isfinite(b[j]);
            amax = fmax(amax, fabs(a[j]));
            dmax = fmax(dmax, fabs((double) a[j] - b[j]));
            if (a[j] > ma) ma = a[j], ia = j;
            if (b[j] > mb) mb = b[j], ib = j;
        }
        c.max_rel = fmax(c.max_rel, dmax / (amax > 0 ? amax : 1));
        double za = 0, zb = 0;
        for (int j = 0; j < n; j++) za += exp(a[j] - ma), zb += exp(b[j] - mb);
        double kl = 0;
        for (int j = 0; j < n; j++) {
            const double lp = a[j] - ma - log(za), lq = b[j] - mb - log(zb);
            kl += exp(lp) * (lp - lq);
        }
        c.mean_kl += kl / rows;
        c.top1 += (ia == ib) / (double) rows;
    }
    return c;
}

typedef struct model_case {
    const char * arch;
    int32_t      dense, expert, residual;
} model_case;

static const char * tname(int32_t t) {
    rm_type_info ti;
    return rm_type_describe(t, &ti) == RM_OK ? ti.name : "?";
}

static void check_case(const char * dir, const model_case * mc, int n_threads, int * gpu_seen) {
    tiny_spec s = tiny_default(mc->arch);
    s.dense_type = mc->dense;
    s.output_type = mc->dense;
    s.expert_type = mc->expert;
    s.residual_type = mc->residual;
    char base[512], res[512], label[96];
    snprintf(label, sizeof(label), "%s-%s-%s-%s", mc->arch, tname(mc->dense), tname(mc->expert),
             mc->residual >= 0 ? tname(mc->residual) : "none");
    snprintf(base, sizeof(base), "%s/%s.gguf", dir, label);
    snprintf(res, sizeof(res), "%s/%s.residual.gguf", dir, label);
    EXPECT(tiny_write(&s, base, mc->residual >= 0 ? res : NULL) == 0, "%s: writing the model", label);
    const int has_res = mc->residual >= 0;
    const char * res_path = has_res ? res : NULL;
    const int n = s.n_vocab, rows = N_PROMPT + N_DECODE;
    const int exact = mc->dense == RM_TYPE_F32 && mc->expert == RM_TYPE_F32;
    float * ref = malloc(sizeof(float) * (size_t) rows * n * 3);
    float * got = malloc(sizeof(float) * (size_t) rows * n);
    const variant cpu = {"cpu", 0, 0, 0};
    rm_gpu_info gi;
    rm_model * mc_cpu = load(base, res_path, &cpu, n_threads, &gi);
    EXPECT(mc_cpu != NULL, "%s: CPU load", label);
    if (!mc_cpu) goto done;
    for (int pol = 0; pol < (has_res ? 3 : 1); pol++) {
        EXPECT(run(mc_cpu, pol, has_res, ref + (size_t) pol * rows * n, n, NULL) == 0, "%s: CPU run", label);
        cmp self = compare(ref + (size_t) pol * rows * n, ref + (size_t) pol * rows * n, rows, n);
        EXPECT(self.finite, "%s: CPU logits are not finite", label);
    }
    rm_model_free(mc_cpu);
    const variant gpus[3] = {{"gpu", 1, 0, 0}, {"gpu-half-experts-on-cpu", 1, 1, 0}, {"gpu-residual-upload", 1, 0, 2}};
    for (int v = 0; v < 3; v++) {
        rm_model * mg = load(base, res_path, &gpus[v], n_threads, &gi);
        EXPECT(mg != NULL, "%s: %s load", label, gpus[v].name);
        if (!mg) continue;
        EXPECT(gi.requested == 1, "%s: the GPU request is recorded", label);
        if (!gi.active) {
            EXPECT(strstr(gi.note, "running on the CPU") != NULL, "%s: fallback note '%s'", label, gi.note);
            if (v == 0) {
                printf("skip %s on the GPU: %s\n", label, gi.note);
                ++n_skipped;
            }
            rm_model_free(mg);
            break;
        }
        *gpu_seen = 1;
        for (int pol = 0; pol < (has_res ? 3 : 1); pol++) {
            rm_backend_stats bs;
            const int ok = run(mg, pol, has_res, got, n, &bs) == 0;
            EXPECT(ok, "%s: %s run policy %d", label, gpus[v].name, pol);
            if (!ok) continue;
            cmp c = compare(ref + (size_t) pol * rows * n, got, rows, n);
            const double tol = exact ? 1e-3 : 0.05;
            EXPECT(c.finite && c.max_rel <= tol && (exact || c.mean_kl <= 1e-3),
                   "%s: %s policy %d vs CPU: max rel %.3g (<= %g), mean KL %.3g, top-1 %.3f", label, gpus[v].name, pol,
                   c.max_rel, tol, c.mean_kl, c.top1);
            EXPECT(bs.h2d_weight_bytes == 0, "%s: %s: %llu weight bytes crossed the bus in decode", label, gpus[v].name,
                   (unsigned long long) bs.h2d_weight_bytes);
            JSON("%s{\"model\":\"%s\",\"variant\":\"%s\",\"policy\":%d,\"max_rel\":%.4g,\"mean_kl\":%.4g,\"top1\":%.4f,"
                 "\"decode_h2d_per_token\":%.1f,\"decode_d2h_per_token\":%.1f,\"decode_weight_bytes\":%llu}",
                 json_n && json[json_n - 1] != '[' ? "," : "", label, gpus[v].name, pol, c.max_rel, c.mean_kl, c.top1,
                 (double) bs.h2d_bytes / N_DECODE, (double) bs.d2h_bytes / N_DECODE,
                 (unsigned long long) bs.h2d_weight_bytes);
        }
        rm_model_free(mg);
    }
    const variant standins[3] = {{"standin", RM_GPU_STANDIN, 0, 0}, {"standin-half-experts-on-cpu", RM_GPU_STANDIN, 1, 0},
                                 {"standin-residual-upload", RM_GPU_STANDIN, 0, 2}};
    for (int v = 0; v < 3; v++) {
        rm_model * md = load(base, res_path, &standins[v], n_threads, &gi);
        EXPECT(md != NULL && gi.active, "%s: %s load", label, standins[v].name);
        if (!md) continue;
        for (int pol = 0; pol < (has_res ? 3 : 1); pol++) {
            rm_backend_stats bs;
            const int ok = run(md, pol, has_res, got, n, &bs) == 0;
            EXPECT(ok, "%s: %s run policy %d", label, standins[v].name, pol);
            if (!ok) continue;
            cmp c = compare(ref + (size_t) pol * rows * n, got, rows, n);
            EXPECT(c.finite && c.max_rel <= 1e-4, "%s: %s policy %d vs CPU: max rel %.3g (<= 1e-4)", label,
                   standins[v].name, pol, c.max_rel);
            EXPECT(bs.h2d_weight_bytes == 0 && bs.d2h_bytes > 0, "%s: %s: %llu weight bytes crossed in decode", label,
                   standins[v].name, (unsigned long long) bs.h2d_weight_bytes);
            EXPECT(strcmp(bs.backend, "standin") == 0, "%s: backend '%s'", label, bs.backend);
        }
        rm_model_free(md);
    }
done:
    free(ref);
    free(got);
}

/* ---- bench --------------------------------------------------------------------------------- */

typedef struct bench_row {
    double pp_tps, tg_tps;
    rm_backend_stats st;
} bench_row;

static int bench_one(rm_model * m, int policy, float budget, int auto_budget, int n_prompt, int n_gen, bench_row * out) {
    rm_session * s = NULL;
    rm_session_params sp = {sizeof(sp), n_prompt + n_gen + 8, 256};
    if (rm_session_new(m, &sp, &s) != RM_OK) {
        printf("bench session: %s\n", rm_last_error());
        return -1;
    }
    rm_model_info in;
    rm_model_info_get(m, &in);
    if (in.has_residual && set_policy(s, policy, budget, in.n_layer) != RM_OK) {
        printf("bench policy: %s\n", rm_last_error());
        rm_session_free(s);
        return -1;
    }
    if (auto_budget) {
        rm_auto_budget ab = {sizeof(ab), budget, 0.0f, 0.5f, 0.005f, 0.7f, 0.1f, budget};
        rm_session_set_auto_budget(s, &ab);
    }
    int32_t * toks = malloc(sizeof(int32_t) * (size_t) (n_prompt + n_gen));
    for (int i = 0; i < n_prompt + n_gen; i++) toks[i] = (i * 7919 + 13) % in.n_vocab;
    float * logits = malloc(sizeof(float) * (size_t) in.n_vocab);
    int rc = rm_session_eval(s, toks, 8, 0, logits, in.n_vocab);   /* warm-up */
    rm_session_reset(s);
    rm_session_clear_stats(s);
    double t0 = now_s();
    rc |= rm_session_eval(s, toks, n_prompt, 0, logits, in.n_vocab);
    const double t1 = now_s();
    rm_session_clear_stats(s);
    const double t2 = now_s();
    for (int i = 0; rc == RM_OK && i < n_gen; i++) {
        rc |= rm_session_eval(s, toks + n_prompt + i, 1, 0, logits, in.n_vocab);
    }
    const double t3 = now_s();
    if (rc != RM_OK) printf("bench eval: %s\n", rm_last_error());
    out->pp_tps = n_prompt / (t1 - t0);
    out->tg_tps = n_gen / (t3 - t2);
    out->st.struct_size = sizeof(out->st);
    rm_session_backend_stats(s, &out->st);
    free(toks);
    free(logits);
    rm_session_free(s);
    return rc == RM_OK ? 0 : -1;
}

static void bench(const char * dir, const char * model, int n_threads) {
    char base[512], res[512];
    if (model) {
        snprintf(base, sizeof(base), "%s", model);
        snprintf(res, sizeof(res), "%.*s.residual.gguf", (int) (strlen(model) - 5), model);
    } else {
        tiny_spec s = tiny_default("qwen3moe");
        s.n_embd = 2048, s.n_layer = 8, s.n_head = 16, s.n_head_kv = 4, s.head_dim = 128;
        s.n_expert = 32, s.n_expert_used = 4, s.n_ff = 768, s.n_vocab = 32000, s.n_ctx = 4096;
        s.expert_type = RM_TYPE_Q3_K, s.residual_type = RM_TYPE_Q8_0, s.dense_type = RM_TYPE_Q8_0;
        s.output_type = RM_TYPE_Q8_0, s.weight_std = 0.02f;
        snprintf(base, sizeof(base), "%s/bench.gguf", dir);
        snprintf(res, sizeof(res), "%s/bench.residual.gguf", dir);
        const double t = now_s();
        if (tiny_write(&s, base, res) != 0) {
            printf("bench: cannot write the bench model\n");
            return;
        }
        printf("bench: wrote a %d-layer, %d-expert model in %.1f s\n", s.n_layer, s.n_expert, now_s() - t);
    }
    const char * res_path = access(res, R_OK) == 0 ? res : NULL;
    struct { const char * name; variant v; int policy; float budget; int auto_b; } rows[] = {
        {"cpu_base_only", {"cpu", 0, 0, 0}, 0, 0.0f, 0},
        {"cpu_residual_0.1", {"cpu", 0, 0, 0}, 2, 0.1f, 0},
        {"gpu_base_only", {"gpu", 1, 0, 0}, 0, 0.0f, 0},
        {"split_residual_0.1", {"gpu", 1, 0, 0}, 2, 0.1f, 0},
        {"split_residual_auto", {"gpu", 1, 0, 0}, 2, 0.05f, 1},
        {"split_half_experts_on_cpu_0.1", {"gpu-half", 1, 1, 0}, 2, 0.1f, 0},
    };
    JSON("],\"bench\":{\"model\":\"%s\",\"residual\":%s,\"rows\":[", base, res_path ? "true" : "false");
    int first = 1;
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        rm_gpu_info gi;
        rm_model * m = load(base, res_path, &rows[i].v, n_threads, &gi);
        if (!m) continue;
        if (rows[i].v.use_gpu && !gi.active) {
            printf("bench %s: skipped (%s)\n", rows[i].name, gi.note);
            rm_model_free(m);
            continue;
        }
        bench_row r;
        if (bench_one(m, rows[i].policy, rows[i].budget, rows[i].auto_b, 256, 64, &r) == 0) {
            printf("bench %-32s pp %8.1f tok/s  tg %7.2f tok/s  bus/token up %.0f down %.0f B, weights %llu B, "
                   "host %.2f ms device %.2f ms, stalls %llu/%llu, auto budget %.3f\n",
                   rows[i].name, r.pp_tps, r.tg_tps, (double) r.st.h2d_bytes / 64, (double) r.st.d2h_bytes / 64,
                   (unsigned long long) r.st.h2d_weight_bytes, r.st.host_ms, r.st.device_ms,
                   (unsigned long long) r.st.n_stalls, (unsigned long long) r.st.n_layer_steps, r.st.auto_budget);
            JSON("%s{\"name\":\"%s\",\"prefill_tps\":%.2f,\"decode_tps\":%.3f,\"decode_h2d_per_token\":%.1f,"
                 "\"decode_d2h_per_token\":%.1f,\"decode_weight_bytes\":%llu,\"host_ms\":%.3f,\"device_ms\":%.3f,"
                 "\"stalls\":%llu,\"layer_steps\":%llu,\"auto_budget\":%.4f,\"gpu_used_bytes\":%llu}",
                 first ? "" : ",", rows[i].name, r.pp_tps, r.tg_tps, (double) r.st.h2d_bytes / 64,
                 (double) r.st.d2h_bytes / 64, (unsigned long long) r.st.h2d_weight_bytes, r.st.host_ms,
                 r.st.device_ms, (unsigned long long) r.st.n_stalls, (unsigned long long) r.st.n_layer_steps,
                 r.st.auto_budget, (unsigned long long) gi.used_bytes);
            first = 0;
            EXPECT(r.st.h2d_weight_bytes == 0, "bench %s: weights crossed the bus in decode", rows[i].name);
        }
        rm_model_free(m);
    }
    JSON("]}");
}

int main(int argc, char ** argv) {
    const char * json_path = NULL, * model = NULL;
    int do_bench = 0, n_threads = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
        else if (!strcmp(argv[i], "--bench")) do_bench = 1;
        else if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) n_threads = atoi(argv[++i]);
        else {
            printf("usage: %s [--json PATH] [--bench [--model BASE.gguf]] [--threads N]\n", argv[0]);
            return 2;
        }
    }
    char dir[] = "/tmp/rm_backend_model_XXXXXX";
    if (!mkdtemp(dir)) {
        printf("cannot make a temporary directory\n");
        return 1;
    }
    printf("%s\n", rm_build_info());
    const model_case cases[] = {
        {"qwen3moe", RM_TYPE_Q8_0, RM_TYPE_Q4_K, RM_TYPE_Q8_0},
        {"qwen2moe", RM_TYPE_Q8_0, RM_TYPE_Q3_K, RM_TYPE_Q4_0},
        {"llama", RM_TYPE_F16, RM_TYPE_Q2_K, RM_TYPE_Q4_0},
        {"qwen3moe", RM_TYPE_Q4_0, RM_TYPE_Q4_0, RM_TYPE_Q8_0},
        {"qwen3moe", RM_TYPE_F32, RM_TYPE_F32, -1},
    };
    int gpu_seen = 0;
    JSON("{\"build\":\"%s\",\"checks\":[", rm_build_info());
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        check_case(dir, &cases[i], n_threads, &gpu_seen);
    }
    if (do_bench) {
        bench(dir, model, n_threads);
    } else {
        JSON("]");
    }
    JSON(",\"gpu\":%s,\"passed\":%d,\"failed\":%d,\"skipped\":%d}\n", gpu_seen ? "true" : "false", n_passed, n_failed,
         n_skipped);
    if (json_path) {
        FILE * f = fopen(json_path, "w");
        if (f) {
            fputs(json, f);
            fclose(f);
        }
    }
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("could not remove %s\n", dir);
    printf("test_backend_model: %d passed, %d failed, %d skipped%s\n", n_passed, n_failed, n_skipped,
           gpu_seen ? "" : " (no GPU: CPU part only)");
    return n_failed ? 1 : 0;
}
