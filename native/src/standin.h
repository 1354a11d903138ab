/* standin.h - internal: a CPU stand-in for the GPU, to run the CPU/device split without one.
 *
 * The stand-in is a second CPU backend posing as a device: its own buffers under its own memory
 * budget (counted as the CUDA device counts them), the same placement of weights (devweights.h,
 * copied into its arena at load, so the forward pass never reads the mapped file's weights
 * through it), explicit copies across a "bus" that count every byte both ways, and the same
 * split of each MoE block (split.h) between its ops and host threads. Its kernels are the CPU
 * backend's, so its logits must equal the CPU's up to the order of float sums. Loaded with
 * use_gpu = RM_GPU_STANDIN (rapidmoe.h); tests/test_split_standin.py exercises it. */
#ifndef RM_STANDIN_H
#define RM_STANDIN_H

#include "backend.h"
#include "threads.h"

typedef struct rm_standin rm_standin;

/* Copies the dense weights and the expert bases p->expert_on_gpu places into the stand-in's
 * arena, within p->gpu_memory_bytes (0: no cap). */
rm_status rm_standin_open(const rm_model * m, const rm_model_params * p, rm_standin ** out);
void      rm_standin_close(rm_standin * d);
/* The device fields of info, as rm_gpu_describe fills them. */
void      rm_standin_describe(const rm_standin * d, rm_gpu_info * info);

/* The stand-in's backend for one session; NULL with the error set and its status in *st. */
rm_backend * rm_backend_standin_new(rm_standin * d, const rm_model * m, rm_pool * pool, int32_t n_batch,
                                    int64_t max_in, int32_t n_ctx, rm_status * st);

#endif
