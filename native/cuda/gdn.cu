/* gdn.cu - the Gated DeltaNet kernels (see gdn.cuh), each step of cpu/deltanet.c's order:
 *
 *   gates      a thread per (token, value head)
 *   conv       a thread per (sequence, channel): the sequence's tokens in order, the window of the
 *              last d_conv inputs in registers, the state written back at the end
 *   l2norm     a warp per (token, key head), q and k
 *   rule       a block per (sequence, value head), thread j owning column j of the state; the
 *              sequence's tokens in order, each one row of its position's chunk as cpu/gdn.h
 *              writes it (the chunk's keys, u and cumulative log-decays kept in the state), the
 *              dot products with the chunk's keys a thread per row of the chunk
 *   gated norm a block per (token, value head)
 *
 * Their sums run in other orders than the CPU's, so their floats differ from it by rounding. */
#include "gdn.cuh"

__device__ static inline float rm_cu_silu(float x) { return x / (1.0f + expf(-x)); }

__global__ void k_gdn_gates(const float * __restrict__ ba, const float * __restrict__ A, const float * __restrict__ dt,
                            float * __restrict__ g, float * __restrict__ beta, int32_t n_tok, int32_t nv, int32_t nk,
                            int32_t fused) {
    const int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t) n_tok * nv) {
        return;
    }
    const int64_t t = i / nv, v = i % nv, r = nv / nk;
    const float * row = ba + t * 2 * nv;
    const int64_t ib = fused ? (v / r) * 2 * r + v % r : v, ia = fused ? ib + r : nv + v;
    beta[i] = 1.0f / (1.0f + expf(-row[ib]));
    const float x = row[ia] + dt[v];
    g[i] = A[v] * (x > 20.0f ? x : log1pf(expf(x)));   /* softplus as torch computes it */
}

__global__ void k_gdn_conv(const float * __restrict__ mixed, float * __restrict__ out, const rm_gdn_seq * seqs,
                           int32_t n_seqs, int64_t cd, const uint8_t * __restrict__ filters, int32_t filter_f16,
                           uint64_t row_bytes, int32_t d_conv) {
    const int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t) n_seqs * cd) {
        return;
    }
    const int64_t c = i % cd;
    const rm_gdn_seq sq = seqs[i / cd];
    const int32_t hist = d_conv - 1;
    float w[RM_CU_GDN_MAX_CONV], win[RM_CU_GDN_MAX_CONV];   /* win: the last d_conv inputs, oldest first */
    const uint8_t * wr = filters + (uint64_t) c * row_bytes;
    for (int32_t k = 0; k < d_conv; k++) {
        w[k] = filter_f16 ? rm_cu_half(((const uint16_t *) wr)[k]) : ((const float *) wr)[k];
    }
    for (int32_t k = 0; k < hist; k++) {
        win[k] = sq.conv_state[(int64_t) k * cd + c];
    }
    for (int32_t t = 0; t < sq.n; t++) {
        const int64_t row = (int64_t) (sq.row0 + t) * cd + c;
        win[hist] = mixed[row];
        float acc = 0.0f;
        for (int32_t k = 0; k < d_conv; k++) {
            acc += w[k] * win[k];
        }
        out[row] = rm_cu_silu(acc);
        for (int32_t k = 0; k < hist; k++) {
            win[k] = win[k + 1];
        }
    }
    for (int32_t k = 0; k < hist; k++) {
        sq.conv_state[(int64_t) k * cd + c] = win[k];
    }
}

/* q (scaled by 1/sqrt(d_k)) and k of each key head to unit length: warp w of the grid takes
 * (token, head, q or k). */
__global__ void k_gdn_l2norm(float * __restrict__ rows, int32_t n_tok, int64_t cd, int32_t nk, int32_t dk) {
    const int64_t job = ((int64_t) blockIdx.x * blockDim.x + threadIdx.x) / RM_WARP;
    const int lane = threadIdx.x % RM_WARP;
    if (job >= (int64_t) n_tok * nk * 2) {
        return;
    }
    const int64_t t = job / (2 * nk), which = job % 2, h = (job / 2) % nk;
    float * x = rows + t * cd + which * (int64_t) nk * dk + h * dk;
    float ss = 0.0f;
    for (int32_t d = lane; d < dk; d += RM_WARP) {
        ss += x[d] * x[d];
    }
    ss = rm_cu_warp_sum(ss);
    const float f = (which == 0 ? rsqrtf((float) dk) : 1.0f) / sqrtf(ss + 1e-6f);
    for (int32_t d = lane; d < dk; d += RM_WARP) {
        x[d] *= f;
    }
}

/* The gated delta rule of one (sequence, value head): cpu/gdn_rule.h's steps, thread j the
 * state's column j (blockDim >= max(d_v, RM_GDN_CHUNK)). Shared: the token's q and k, and its dot
 * products with the chunk's keys. */
__global__ void k_gdn_rule(const float * __restrict__ conv_out, const float * __restrict__ g,
                           const float * __restrict__ beta, float * __restrict__ core, const rm_gdn_seq * seqs,
                           int32_t nk, int32_t nv, int32_t dk, int32_t dv, int32_t tiled, int64_t per_head) {
    extern __shared__ float sh[];
    float * q = sh, * k = q + dk, * dkk = k + dk, * dqk = dkk + RM_GDN_CHUNK;   /* dk, dk, C, C floats */
    const int32_t v = blockIdx.x % nv, j = threadIdx.x, C = RM_GDN_CHUNK;
    const rm_gdn_seq sq = seqs[blockIdx.x / nv];
    const int64_t kd = (int64_t) nk * dk, di = (int64_t) nv * dv, cd = 2 * kd + di;
    const int64_t kh = tiled ? v % nk : v / (nv / nk);
    float * S = sq.ssm_state + (int64_t) v * per_head;   /* per_head: rm_gdn_state_floats */
    float * PK = S + (int64_t) dk * dv, * PU = PK + (int64_t) C * dk, * PG = PU + (int64_t) C * dv;
    for (int32_t t = 0; t < sq.n; t++) {
        const int64_t row = sq.row0 + t;
        const int32_t r = (int32_t) (((int64_t) sq.pos + t) % C);
        const float * rq = conv_out + row * cd + kh * dk, * rk = rq + kd, * rv = conv_out + row * cd + 2 * kd + (int64_t) v * dv;
        const float b = beta[row * nv + v];
        const float G = (r > 0 ? PG[r - 1] : 0.0f) + g[row * nv + v];
        const float e = expf(G);
        for (int32_t i = j; i < dk; i += blockDim.x) {
            q[i] = rq[i];
            k[i] = rk[i];
            PK[(int64_t) r * dk + i] = rk[i];
        }
        __syncthreads();                            /* G is read from PG[r - 1] by all before PG[r] is set */
        if (j == 0) {
            PG[r] = G;
        }
        if (j <= r) {                               /* the token's keys and queries against the chunk's rows */
            float sk = 0.0f, sqk = 0.0f;
            const float * pk = PK + (int64_t) j * dk;
            for (int32_t i = 0; i < dk; i++) {
                sk += k[i] * pk[i];
                sqk += q[i] * pk[i];
            }
            dkk[j] = sk;
            dqk[j] = sqk;
        }
        __syncthreads();
        if (j < dv) {
            float u = 0.0f, rr = 0.0f;              /* (S0^T k)_j and (S0^T q)_j */
            for (int32_t i = 0; i < dk; i++) {
                const float s = S[(int64_t) i * dv + j];
                u += s * k[i];
                rr += s * q[i];
            }
            u = b * (rv[j] - e * u);
            for (int32_t s = 0; s < r; s++) {
                u -= b * dkk[s] * expf(G - PG[s]) * PU[(int64_t) s * dv + j];
            }
            PU[(int64_t) r * dv + j] = u;
            float o = e * rr;
            for (int32_t s = 0; s <= r; s++) {
                o += dqk[s] * expf(G - PG[s]) * PU[(int64_t) s * dv + j];
            }
            core[row * di + (int64_t) v * dv + j] = o;
        }
        __syncthreads();
        if (r == C - 1 && j < dv) {                 /* the chunk is complete: the next one's S0 */
            for (int32_t i = 0; i < dk; i++) {
                float s = e * S[(int64_t) i * dv + j];
                for (int32_t c = 0; c < C; c++) {
                    s += expf(G - PG[c]) * PK[(int64_t) c * dk + i] * PU[(int64_t) c * dv + j];
                }
                S[(int64_t) i * dv + j] = s;
            }
        }
        __syncthreads();
    }
}

/* y <- rmsnorm(y) * w * act(z) (sigmoid when `sigmoid`, else silu), a block per (token, value head)
 * row of d_v. */
__global__ void k_gdn_gated_norm(float * __restrict__ y, const float * __restrict__ z, const float * __restrict__ w,
                                 int32_t dv, float eps, int32_t sigmoid) {
    __shared__ float part[32];
    float * yr = y + (int64_t) blockIdx.x * dv;
    const float * zr = z + (int64_t) blockIdx.x * dv;
    float ss = 0.0f;
    for (int32_t i = threadIdx.x; i < dv; i += blockDim.x) {
        ss += yr[i] * yr[i];
    }
    ss = rm_cu_warp_sum(ss);
    if (threadIdx.x % RM_WARP == 0) {
        part[threadIdx.x / RM_WARP] = ss;
    }
    __syncthreads();
    if (threadIdx.x < RM_WARP) {
        ss = threadIdx.x < blockDim.x / RM_WARP ? part[threadIdx.x] : 0.0f;
        ss = rm_cu_warp_sum(ss);
        if (threadIdx.x == 0) {
            part[0] = ss;
        }
    }
    __syncthreads();
    const float f = rsqrtf(part[0] / (float) dv + eps);
    for (int32_t i = threadIdx.x; i < dv; i += blockDim.x) {
        const float gate = sigmoid ? 1.0f / (1.0f + expf(-zr[i])) : rm_cu_silu(zr[i]);
        yr[i] = yr[i] * f * w[i] * gate;
    }
}

cudaError_t rm_cu_gdn(cudaStream_t st, const rm_gdn_args * a, const rm_gdn_seq * seqs_dev, const uint8_t * filters,
                      int32_t filter_type, uint64_t filter_row_bytes, const float * A, const float * dt,
                      const float * norm) {
    if (a->n_tok <= 0 || a->n_seqs <= 0) {
        return cudaSuccess;
    }
    if (a->d_conv < 1 || a->d_conv > RM_CU_GDN_MAX_CONV || a->d_v > RM_CU_GDN_MAX_DV || a->n_k <= 0 ||
        a->n_v % a->n_k != 0 || (filter_type != RM_TYPE_F32 && filter_type != RM_TYPE_F16)) {
        return cudaErrorInvalidValue;
    }
    const int64_t kd = (int64_t) a->n_k * a->d_k, cd = 2 * kd + (int64_t) a->n_v * a->d_v;
    const int64_t nt = (int64_t) a->n_tok;
    k_gdn_gates<<<rm_cu_blocks(nt * a->n_v, 256), 256, 0, st>>>(a->ba, A, dt, a->g, a->beta, a->n_tok, a->n_v, a->n_k,
                                                               a->fused_ba);
    k_gdn_conv<<<rm_cu_blocks((int64_t) a->n_seqs * cd, 128), 128, 0, st>>>(
        a->mixed, a->conv_out, seqs_dev, a->n_seqs, cd, filters, filter_type == RM_TYPE_F16, filter_row_bytes, a->d_conv);
    k_gdn_l2norm<<<rm_cu_blocks(nt * a->n_k * 2 * RM_WARP, 256), 256, 0, st>>>(a->conv_out, a->n_tok, cd, a->n_k,
                                                                               a->d_k);
    int threads = a->d_v > RM_GDN_CHUNK ? a->d_v : RM_GDN_CHUNK;
    threads = (threads + RM_WARP - 1) / RM_WARP * RM_WARP;
    const size_t shared = sizeof(float) * (size_t) (2 * a->d_k + 2 * RM_GDN_CHUNK);
    k_gdn_rule<<<(unsigned) (a->n_seqs * a->n_v), threads, shared, st>>>(a->conv_out, a->g, a->beta, a->core, seqs_dev,
                                                                         a->n_k, a->n_v, a->d_k, a->d_v, a->tiled,
                                                                         rm_gdn_state_floats(a->d_k, a->d_v));
    const int nthreads = a->d_v < 256 ? (a->d_v + RM_WARP - 1) / RM_WARP * RM_WARP : 256;
    k_gdn_gated_norm<<<(unsigned) (nt * a->n_v), nthreads, 0, st>>>(a->core, a->z, norm, a->d_v, a->eps,
                                                                    a->gate_sigmoid);
    return cudaGetLastError();
}

__global__ void k_copy_rows(float * __restrict__ dst, int64_t dst_stride, const float * __restrict__ src,
                            int64_t src_stride, int64_t width, int64_t n_rows) {
    const int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n_rows * width) {
        dst[(i / width) * dst_stride + i % width] = src[(i / width) * src_stride + i % width];
    }
}

cudaError_t rm_cu_copy_rows(cudaStream_t st, float * dst, int64_t dst_stride, const float * src, int64_t src_stride,
                            int64_t width, int64_t n_rows) {
    if (width <= 0 || n_rows <= 0) {
        return cudaSuccess;
    }
    k_copy_rows<<<rm_cu_blocks(n_rows * width, 256), 256, 0, st>>>(dst, dst_stride, src, src_stride, width, n_rows);
    return cudaGetLastError();
}

__global__ void k_mul_sigmoid(float * __restrict__ y, const float * __restrict__ gate, int64_t n, int64_t width) {
    const int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] /= 1.0f + expf(-gate[i / width]);
    }
}

cudaError_t rm_cu_mul_sigmoid(cudaStream_t st, float * y, const float * gate, int64_t n, int64_t width) {
    if (n <= 0 || width <= 0) {
        return cudaSuccess;
    }
    k_mul_sigmoid<<<rm_cu_blocks(n * width, 256), 256, 0, st>>>(y, gate, n * width, width);
    return cudaGetLastError();
}
