/* test_backend_gdn.c - the Gated DeltaNet kernels (cpu/gdn.c) on random inputs (never zeros),
 * against a double-precision delta rule written here from its definition:
 *
 *   recurrent form vs reference   1e-5 of max |o| (float state, the same order of operations)
 *   chunked form vs reference     1e-5 of max |o|, and the final state within 1e-5 of max |S|,
 *                                 for lengths that end inside, at and past a chunk boundary
 *   convolution                   split into calls of 1, 2 and 5 tokens vs one call: equal within
 *                                 1e-6 (the rolling state carries the history), vs reference 1e-6
 *   gated norm                    1e-5 relative
 *   each instruction set's delta-rule step, chunked form and conv (cpu/gdn_x86.h) vs their scalar twins: outputs
 *                                 and states within 1e-5 of their max (fused multiply-adds round
 *                                 differently), over shapes that take the vector path and ones
 *                                 that fall back to the twin */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/dispatch.h"
#include "cpu/gdn.h"
#include "tiny_gguf.h"
#include "expect.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static float * randn(int64_t n, float scale) {
    float * x = malloc(sizeof(float) * (size_t) n);
    for (int64_t i = 0; i < n; i++) {
        x[i] = scale * tiny_gauss(&rng);
        if (x[i] == 0.0f) x[i] = scale * 1e-3f;
    }
    return x;
}

/* the delta rule in doubles, token by token, from the definition in gdn.h */
static void reference(const rm_gdn_head * h, double * S, double * o) {
    const int dk = h->d_k, dv = h->d_v;
    double * u = malloc(sizeof(double) * (size_t) dv);
    for (int t = 0; t < h->n_tok; t++) {
        const float * q = h->q + t * h->qk_stride, * k = h->k + t * h->qk_stride, * v = h->v + t * h->v_stride;
        const double decay = exp((double) h->g[t * h->gb_stride]), beta = h->beta[t * h->gb_stride];
        for (int i = 0; i < dk * dv; i++) S[i] *= decay;
        for (int j = 0; j < dv; j++) {
            double sk = 0.0;
            for (int i = 0; i < dk; i++) sk += S[i * dv + j] * k[i];
            u[j] = beta * (v[j] - sk);
        }
        for (int i = 0; i < dk; i++)
            for (int j = 0; j < dv; j++) S[i * dv + j] += k[i] * u[j];
        for (int j = 0; j < dv; j++) {
            double acc = 0.0;
            for (int i = 0; i < dk; i++) acc += S[i * dv + j] * q[i];
            o[t * dv + j] = acc;
        }
    }
    free(u);
}

static double max_abs_d(const double * x, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

static void test_delta_rule(int n_tok, int dk, int dv) {
    float * q = randn((int64_t) n_tok * dk, 1.0f), * k = randn((int64_t) n_tok * dk, 1.0f);
    float * v = randn((int64_t) n_tok * dv, 1.0f), * g = randn(n_tok, 1.0f), * beta = randn(n_tok, 1.0f);
    rm_gdn_l2norm(q, n_tok, dk, dk, 1e-6f, 1.0f / sqrtf((float) dk));
    rm_gdn_l2norm(k, n_tok, dk, dk, 1e-6f, 1.0f);
    for (int t = 0; t < n_tok; t++) {
        g[t] = -0.05f - 0.5f * fabsf(g[t]);            /* decays in (0, 0.95) */
        beta[t] = 1.0f / (1.0f + expf(-beta[t]));
    }
    const int64_t ns = (int64_t) dk * dv;
    float * S0 = randn(ns, 0.3f);                        /* a state left by earlier tokens */
    float * Sr = malloc(sizeof(float) * (size_t) ns), * Sc = malloc(sizeof(float) * (size_t) ns);
    memcpy(Sr, S0, sizeof(float) * (size_t) ns);
    memcpy(Sc, S0, sizeof(float) * (size_t) ns);
    double * Sd = malloc(sizeof(double) * (size_t) ns), * od = malloc(sizeof(double) * (size_t) n_tok * dv);
    for (int64_t i = 0; i < ns; i++) Sd[i] = S0[i];
    float * orr = calloc((size_t) n_tok * dv, sizeof(float)), * oc = calloc((size_t) n_tok * dv, sizeof(float));
    float * scratch = malloc(sizeof(float) * (size_t) rm_gdn_chunk_scratch(dk, dv));
    rm_gdn_head h = {q, k, dk, v, dv, g, beta, 1, orr, dv, n_tok, dk, dv};
    reference(&h, Sd, od);
    rm_gdn_recurrent(&h, Sr);
    h.o = oc;
    rm_gdn_chunked(&h, Sc, scratch);
    const double om = max_abs_d(od, (int64_t) n_tok * dv), sm = max_abs_d(Sd, ns);
    double er = 0.0, ec = 0.0, esr = 0.0, esc = 0.0;
    for (int64_t i = 0; i < (int64_t) n_tok * dv; i++) {
        er = fmax(er, fabs(orr[i] - od[i]));
        ec = fmax(ec, fabs(oc[i] - od[i]));
    }
    for (int64_t i = 0; i < ns; i++) {
        esr = fmax(esr, fabs(Sr[i] - Sd[i]));
        esc = fmax(esc, fabs(Sc[i] - Sd[i]));
    }
    printf("delta rule n=%d dk=%d dv=%d: recurrent %.2g, chunked %.2g (of max |o| %.3g); state %.2g, %.2g\n", n_tok,
           dk, dv, er / om, ec / om, om, esr / sm, esc / sm);
    EXPECT(er <= 1e-5 * om, "recurrent n=%d: %.3g > 1e-5 * %.3g", n_tok, er, om);
    EXPECT(ec <= 1e-5 * om, "chunked n=%d: %.3g > 1e-5 * %.3g", n_tok, ec, om);
    EXPECT(esr <= 1e-5 * sm && esc <= 1e-5 * sm, "final state n=%d: %.3g, %.3g > 1e-5 * %.3g", n_tok, esr, esc, sm);
    float * bufs[] = {q, k, v, g, beta, S0, Sr, Sc, orr, oc, scratch};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) free(bufs[i]);
    free(Sd);
    free(od);
}

static void test_conv(void) {
    enum { N = 8, C = 12, K = 4 };
    float * x = randn(N * C, 1.0f), * w = randn(C * K, 0.5f);
    float state1[(K - 1) * C] = {0}, state2[(K - 1) * C] = {0};
    float one[N * C], parts[N * C];
    rm_gdn_conv(one, x, N, C, C, state1, w, K);
    const int steps[] = {1, 2, 5};
    for (int i = 0, t = 0; i < 3; t += steps[i], i++) {
        rm_gdn_conv(parts + t * C, x + t * C, steps[i], C, C, state2, w, K);
    }
    double e = 0.0, eref = 0.0;
    for (int i = 0; i < N * C; i++) e = fmax(e, fabs(one[i] - parts[i]));
    for (int i = 0; i < (K - 1) * C; i++) e = fmax(e, fabs(state1[i] - state2[i]));
    for (int t = 0; t < N; t++) {
        for (int c = 0; c < C; c++) {
            double acc = 0.0;
            for (int i = 0; i < K; i++) {
                const int src = t - (K - 1) + i;
                acc += src < 0 ? 0.0 : (double) w[c * K + i] * x[src * C + c];
            }
            eref = fmax(eref, fabs(one[t * C + c] - acc / (1.0 + exp(-acc))));
        }
    }
    /* two slices of the channels (rows C apart) with their own state columns: the same floats */
    float state3[(K - 1) * C] = {0}, slices[N * C];
    rm_gdn_conv(slices, x, N, 5, C, state3, w, K);
    rm_gdn_conv(slices + 5, x + 5, N, C - 5, C, state3 + 5, w + 5 * K, K);
    for (int i = 0; i < N * C; i++) e = fmax(e, fabs(one[i] - slices[i]));
    for (int i = 0; i < (K - 1) * C; i++) e = fmax(e, fabs(state1[i] - state3[i]));
    EXPECT(e <= 1e-6, "conv in parts vs at once: %.3g", e);
    EXPECT(eref <= 1e-6, "conv vs reference: %.3g", eref);
    free(x);
    free(w);
}

static void test_gated_norm(void) {
    enum { R = 3, N = 16 };
    float * y = randn(R * N, 1.0f), * z = randn(R * N, 1.0f), * w = randn(N, 1.0f);
    float y0[R * N];
    memcpy(y0, y, sizeof(y0));
    rm_gdn_gated_norm(y, z, w, R, N, 1e-6f);
    double e = 0.0;
    for (int r = 0; r < R; r++) {
        double ss = 0.0;
        for (int i = 0; i < N; i++) ss += (double) y0[r * N + i] * y0[r * N + i];
        const double f = 1.0 / sqrt(ss / N + 1e-6);
        for (int i = 0; i < N; i++) {
            const double zz = z[r * N + i], want = y0[r * N + i] * f * w[i] * zz / (1.0 + exp(-zz));
            e = fmax(e, fabs(y[r * N + i] - want) / (fabs(want) + 1e-3));
        }
    }
    EXPECT(e <= 1e-5, "gated norm: %.3g", e);
    free(y);
    free(z);
    free(w);
}

static double max_diff(const float * a, const float * b, int64_t n, double * max_b) {
    double e = 0.0;
    for (int64_t i = 0; i < n; i++) {
        e = fmax(e, fabs((double) a[i] - b[i]));
        *max_b = fmax(*max_b, fabs((double) b[i]));
    }
    return e;
}

/* The delta rule of `isa` against the scalar twin, from the same state: the recurrent step, or
 * with `chunked` the chunked form. */
static void test_rule_isa(rm_isa isa, int chunked, int n_tok, int dk, int dv) {
    float * q = randn((int64_t) n_tok * dk, 1.0f), * k = randn((int64_t) n_tok * dk, 1.0f);
    float * v = randn((int64_t) n_tok * dv, 1.0f), * g = randn(n_tok, 1.0f), * beta = randn(n_tok, 1.0f);
    rm_gdn_l2norm(q, n_tok, dk, dk, 1e-6f, 1.0f / sqrtf((float) dk));
    rm_gdn_l2norm(k, n_tok, dk, dk, 1e-6f, 1.0f);
    for (int t = 0; t < n_tok; t++) {
        g[t] = -0.05f - 0.5f * fabsf(g[t]);
        beta[t] = 1.0f / (1.0f + expf(-beta[t]));
    }
    const int64_t ns = (int64_t) dk * dv, no = (int64_t) n_tok * dv;
    float * S1 = randn(ns, 0.3f), * S2 = malloc(sizeof(float) * (size_t) ns);
    memcpy(S2, S1, sizeof(float) * (size_t) ns);
    float * o1 = calloc((size_t) no, sizeof(float)), * o2 = calloc((size_t) no, sizeof(float));
    float * scratch = malloc(sizeof(float) * (size_t) rm_gdn_chunk_scratch(dk, dv));
    rm_gdn_head h = {q, k, dk, v, dv, g, beta, 1, o1, dv, n_tok, dk, dv};
    if (chunked) {
        rm_gdn_chunked(&h, S1, scratch);
        h.o = o2;
        rm_cpu_gdn_chunked_isa(isa)(&h, S2, scratch);
    } else {
        rm_gdn_recurrent(&h, S1);
        h.o = o2;
        rm_cpu_gdn_recurrent_isa(isa)(&h, S2);
    }
    double om = 0.0, sm = 0.0;
    const double eo = max_diff(o2, o1, no, &om), es = max_diff(S2, S1, ns, &sm);
    const char * form = chunked ? "chunked" : "step";
    printf("%s %s n=%d dk=%d dv=%d: o %.2g, state %.2g relative\n", rm_isa_name(isa), form, n_tok, dk, dv, eo / om,
           es / sm);
    EXPECT(eo <= 1e-5 * om && es <= 1e-5 * sm, "%s %s n=%d dk=%d dv=%d: o %.3g of %.3g, state %.3g of %.3g",
           rm_isa_name(isa), form, n_tok, dk, dv, eo, om, es, sm);
    float * bufs[] = {q, k, v, g, beta, S1, S2, o1, o2, scratch};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) free(bufs[i]);
}

/* The conv of `isa` against the scalar twin, in calls of 1, 2 and 5 tokens (the state carried). */
static void test_conv_isa(rm_isa isa, int64_t C, int K) {
    enum { N = 8 };
    float * x = randn(N * C, 1.0f), * w = randn(C * K, 0.5f);
    float * st1 = calloc((size_t) ((K - 1) * C), sizeof(float)), * st2 = calloc((size_t) ((K - 1) * C), sizeof(float));
    float * y1 = malloc(sizeof(float) * (size_t) (N * C)), * y2 = malloc(sizeof(float) * (size_t) (N * C));
    const int steps[] = {1, 2, 5};
    for (int i = 0, t = 0; i < 3; t += steps[i], i++) {
        rm_gdn_conv(y1 + t * C, x + t * C, steps[i], C, C, st1, w, K);
        /* a slice of the channels per call, as threads take them: the same floats as the whole */
        const int64_t c0 = C >= 16 ? 8 : 0;
        rm_cpu_gdn_conv_isa(isa)(y2 + t * C, x + t * C, steps[i], c0, C, st2, w, K);
        rm_cpu_gdn_conv_isa(isa)(y2 + t * C + c0, x + t * C + c0, steps[i], C - c0, C, st2 + c0, w + c0 * K, K);
    }
    double ym = 0.0, sm = 0.0;
    const double ey = max_diff(y2, y1, N * C, &ym), es = max_diff(st2, st1, (K - 1) * C, &sm);
    printf("%s conv C=%lld: %.2g relative\n", rm_isa_name(isa), (long long) C, ey / ym);
    EXPECT(ey <= 1e-5 * ym && es == 0.0, "%s conv C=%lld K=%d: %.3g of %.3g, state %.3g", rm_isa_name(isa),
           (long long) C, K, ey, ym, es);
    float * bufs[] = {x, w, st1, st2, y1, y2};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) free(bufs[i]);
}

static void test_isas(void) {
    for (int isa = RM_ISA_SCALAR; isa <= (int) rm_isa_best(); isa++) {
        const int shapes[][3] = {{1, 16, 16}, {5, 128, 128}, {3, 32, 8}, {4, 8, 12}};
        for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
            test_rule_isa((rm_isa) isa, 0, shapes[i][0], shapes[i][1], shapes[i][2]);
        }
        const int chunked[][3] = {{RM_GDN_CHUNK + 37, 128, 128}, {5, 32, 24}, {70, 16, 8}, {9, 12, 16}, {3, 16, 20}};
        for (size_t i = 0; i < sizeof(chunked) / sizeof(chunked[0]); i++) {
            test_rule_isa((rm_isa) isa, 1, chunked[i][0], chunked[i][1], chunked[i][2]);
        }
        test_conv_isa((rm_isa) isa, 24, 4);
        test_conv_isa((rm_isa) isa, 12, 4);
        test_conv_isa((rm_isa) isa, 16, 2);
    }
}

int main(void) {
    const int lens[] = {1, 5, RM_GDN_CHUNK, RM_GDN_CHUNK + 1, 2 * RM_GDN_CHUNK + 37};
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        test_delta_rule(lens[i], 16, 16);
    }
    test_delta_rule(100, 32, 8);
    test_delta_rule(70, 8, 48);
    test_conv();
    test_gated_norm();
    test_isas();
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
