/* xcache.c - the routed experts read from the files into a cache of slots (xcache.h). */
#include "xcache.h"

#include "gguf.h"
#include "model.h"
#include "profile.h"
#include "status.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* O_DIRECT's unit: offsets, lengths and buffers aligned to it (4 KiB covers every block size) */
#define XC_ALIGN 4096u

enum { SLOT_EMPTY = 0, SLOT_READING = 1, SLOT_READY = 2 };

/* One matrix of a (layer, tier): expert e's rows at off0 + e * bytes in file fd, at `at` in a slot. */
typedef struct xc_mat {
    uint64_t  off0, bytes, at;
    int       file;            /* 0: the base file, 1: the residual sidecar */
    rm_weight w;               /* type, ne and row_bytes of one expert's matrix */
} xc_mat;

typedef struct xc_file {
    int    fd, fd_direct;      /* the file read through the page cache, and with O_DIRECT (or -1) */
    int    direct;             /* reads go to fd_direct (cleared if the file system refuses them) */
    char * path;
    const uint8_t * map;       /* the loader's mapping: data pointers minus map give file offsets */
} xc_file;

struct rm_xcache {
    xc_file    files[2];
    int32_t    n_layer, n_expert, n_units;
    xc_mat *   mats;           /* (il * 2 + tier) * RM_XC_MATS + k */
    uint64_t   slot_bytes, cache_bytes;
    int32_t    n_slots, window;
    uint8_t *  mem;
    int32_t *  where;          /* unit -> slot, or -1 */
    int32_t *  owner;          /* slot -> unit, or -1 */
    uint8_t *  state;          /* slot: SLOT_* */
    uint8_t *  ahead;          /* slot: filled by the reader and not got since */
    uint64_t * used;           /* slot: tick of its last use; >= window0: in the current window */
    uint64_t   tick, window0;
    uint32_t * uses;           /* unit: how often it was asked for, halved every n_units asks */
    uint64_t   asks;
    int        lfu;            /* evict the least often used unit, ties the least recently used (else: LRU) */

    pthread_mutex_t mu;
    pthread_cond_t  work, done;
    pthread_mutex_t io;        /* one read at a time: a disk shared by two readers gives each less than half */
    int32_t         waiting;   /* the evaluation waits for io: the reader starts nothing new */
    pthread_t       reader;
    int             has_reader, stop;
    int             predict;   /* RM_PREFETCH_PREDICT: the next layer's experts are guessed and read too */
    int32_t *       queue;     /* units for the reader, a ring of n_slots */
    int32_t         q_head, q_n;

    rm_expert_cache_stats st;
};

static int32_t unit_of(const rm_xcache * c, int il, int32_t e, int tier) {
    return ((int32_t) il * c->n_expert + e) * 2 + tier;
}

static const xc_mat * mats_of(const rm_xcache * c, int32_t unit) {
    const int32_t il = unit / 2 / c->n_expert, tier = unit % 2;
    return &c->mats[((int64_t) il * 2 + tier) * RM_XC_MATS];
}

static uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* Reads up to len bytes at off into dst; returns the bytes read (short only at the end of the
 * file) or -1 with errno set. */
static int64_t read_full(int fd, uint8_t * dst, uint64_t len, uint64_t off) {
    uint64_t done = 0;
    while (done < len) {
        const ssize_t n = pread(fd, dst + done, (size_t) (len - done), (off_t) (off + done));
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            return -1;
        }
        if (n == 0) {
            break;
        }
        done += (uint64_t) n;
    }
    return (int64_t) done;
}

static int open_file(const char * path, int direct) {
#ifdef O_DIRECT
    if (direct) {
        return open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    }
#endif
    (void) direct;
    return open(path, O_RDONLY | O_CLOEXEC);
}

/* Reads unit's matrices into slot memory p. Returns RM_OK, or RM_E_IO with the message set (only
 * on the evaluation's thread: the reader thread passes report 0 and the evaluation reads again). */
static rm_status read_unit(rm_xcache * c, int32_t unit, uint8_t * p, int report) {
    const xc_mat * mt = mats_of(c, unit);
    const int32_t e = unit / 2 % c->n_expert, il = unit / 2 / c->n_expert;
    for (int k = 0; k < RM_XC_MATS; k++) {
        const xc_mat * x = &mt[k];
        if (x->bytes == 0) {
            continue;
        }
        xc_file * f = &c->files[x->file];
        const uint64_t off = x->off0 + (uint64_t) e * x->bytes, lo = off / XC_ALIGN * XC_ALIGN;
        const uint64_t want = off - lo + x->bytes, len = round_up(want, XC_ALIGN);
        const int direct = f->direct;
        int64_t got = read_full(direct ? f->fd_direct : f->fd, p + x->at, len, lo);
        if (got < 0 && errno == EINVAL && direct) {   /* O_DIRECT refused after all: read through the page cache */
            f->direct = 0;
            got = read_full(f->fd, p + x->at, len, lo);
        }
        if (got < 0 || (uint64_t) got < want) {
            if (!report) {
                return RM_E_IO;
            }
            if (got < 0) {
                return rm_fail(RM_E_IO, "expert cache: %s: reading expert %d of layer %d (%" PRIu64 " bytes at offset %" PRIu64
                               ") failed: %s", f->path, e, il, x->bytes, off, strerror(errno));
            }
            return rm_fail(RM_E_IO, "expert cache: %s: expert %d of layer %d needs bytes up to offset %" PRIu64
                           ", but the file ends at %" PRIu64 " (truncated since it was loaded?)", f->path, e, il,
                           off + x->bytes, lo + (uint64_t) got);
        }
    }
    return RM_OK;
}

/* The slot to fill next: an empty one, else, outside the window and not being read, the least
 * often used residual, else the least often used base (bases stay before residuals: every token
 * that routes to an expert needs its base, only the policy's chosen ones its residual); among
 * equals the least recently used. -1 when there is none. Called with mu held. */
static int32_t victim(const rm_xcache * c) {
    int32_t best[2] = {-1, -1};   /* per tier */
    for (int32_t s = 0; s < c->n_slots; s++) {
        if (c->state[s] == SLOT_EMPTY) {
            return s;
        }
        if (c->state[s] == SLOT_READING || c->used[s] >= c->window0) {
            continue;
        }
        const int tier = c->owner[s] % 2;
        const int32_t b = best[tier];
        if (b < 0 || (c->lfu && c->uses[c->owner[s]] != c->uses[c->owner[b]] ? c->uses[c->owner[s]] < c->uses[c->owner[b]]
                                                                               : c->used[s] < c->used[b])) {
            best[tier] = s;
        }
    }
    return best[RM_XC_RES] >= 0 ? best[RM_XC_RES] : best[RM_XC_BASE];
}

/* Gives slot s to unit (evicting its unit), marked as being read. Called with mu held. */
static void assign(rm_xcache * c, int32_t s, int32_t unit) {
    if (c->owner[s] >= 0) {
        c->where[c->owner[s]] = -1;
        c->st.evictions++;
    } else {
        c->st.slots_used++;
    }
    c->owner[s] = unit;
    c->where[unit] = s;
    c->state[s] = SLOT_READING;
    c->ahead[s] = 0;
    c->used[s] = ++c->tick;
}

/* A failed read leaves its slot empty. Called with mu held. */
static void release(rm_xcache * c, int32_t s) {
    c->where[c->owner[s]] = -1;
    c->owner[s] = -1;
    c->state[s] = SLOT_EMPTY;
    c->used[s] = 0;
    c->st.slots_used--;
}

static void * reader_main(void * arg) {
    rm_xcache * c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->stop && (c->q_n == 0 || c->waiting > 0)) {
            pthread_cond_wait(&c->work, &c->mu);
        }
        if (c->stop) {
            break;
        }
        const int32_t unit = c->queue[c->q_head];
        c->q_head = (c->q_head + 1) % c->n_slots;
        c->q_n--;
        const int32_t s = c->where[unit];
        if (s < 0 || c->state[s] != SLOT_READING) {
            continue;
        }
        pthread_mutex_unlock(&c->mu);
        pthread_mutex_lock(&c->io);
        const rm_status st = read_unit(c, unit, c->mem + (uint64_t) s * c->slot_bytes, 0);
        pthread_mutex_unlock(&c->io);
        pthread_mutex_lock(&c->mu);
        const xc_mat * mt = mats_of(c, unit);
        if (st == RM_OK) {
            c->state[s] = SLOT_READY;
            c->ahead[s] = 1;
            c->st.prefetched++;
            for (int k = 0; k < RM_XC_MATS; k++) c->st.bytes_read += mt[k].bytes;
        } else {
            release(c, s);
        }
        pthread_cond_broadcast(&c->done);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

int32_t rm_xcache_window(const rm_xcache * c) { return c->window; }

int rm_xcache_predicts(const rm_xcache * c) { return c->has_reader && c->predict; }

void rm_xcache_begin(rm_xcache * c) {
    pthread_mutex_lock(&c->mu);
    c->window0 = ++c->tick;
    pthread_mutex_unlock(&c->mu);
}

static void views(const rm_xcache * c, int32_t unit, const uint8_t * p, rm_weight out[RM_XC_MATS]) {
    const xc_mat * mt = mats_of(c, unit);
    const int32_t e = unit / 2 % c->n_expert;
    for (int k = 0; k < RM_XC_MATS; k++) {
        out[k] = mt[k].w;
        if (mt[k].bytes) {
            const uint64_t off = mt[k].off0 + (uint64_t) e * mt[k].bytes;
            out[k].data = p + mt[k].at + off % XC_ALIGN;
        }
    }
}

rm_status rm_xcache_get(rm_xcache * c, int il, int32_t e, int tier, rm_weight out[RM_XC_MATS]) {
    const int32_t unit = unit_of(c, il, e, tier);
    const double t0 = rm_now_us();
    pthread_mutex_lock(&c->mu);
    if (c->lfu) {
        c->uses[unit]++;
        if (++c->asks % (uint64_t) c->n_units == 0) {   /* aging: the past counts half */
            for (int32_t u = 0; u < c->n_units; u++) c->uses[u] >>= 1;
        }
    }
    int32_t s = c->where[unit];
    int waited = 0;
    while (s >= 0 && c->state[s] == SLOT_READING) {   /* the reader has it in hand */
        pthread_cond_wait(&c->done, &c->mu);
        s = c->where[unit];
        waited = 1;
    }
    if (s >= 0) {
        c->used[s] = ++c->tick;
        if (c->ahead[s]) {
            c->ahead[s] = 0;
            c->st.prefetch_used++;
        } else {
            c->st.hits++;
        }
        if (waited) {
            c->st.wait_us += (uint64_t) (rm_now_us() - t0);
        }
        pthread_mutex_unlock(&c->mu);
        views(c, unit, c->mem + (uint64_t) s * c->slot_bytes, out);
        return RM_OK;
    }
    s = victim(c);
    if (s < 0) {   /* the window's size keeps a slot free: a caller past it is a bug */
        pthread_mutex_unlock(&c->mu);
        return rm_fail(RM_E_INTERNAL, "expert cache: no free slot for expert %d of layer %d (%d slots)", e, il, c->n_slots);
    }
    assign(c, s, unit);
    c->st.misses++;
    c->waiting++;
    pthread_mutex_unlock(&c->mu);
    uint8_t * p = c->mem + (uint64_t) s * c->slot_bytes;
    pthread_mutex_lock(&c->io);   /* after the reader's unit in hand, if any */
    const rm_status st = read_unit(c, unit, p, 1);
    pthread_mutex_unlock(&c->io);
    pthread_mutex_lock(&c->mu);
    if (--c->waiting == 0) {
        pthread_cond_signal(&c->work);
    }
    if (st == RM_OK) {
        c->state[s] = SLOT_READY;
        const xc_mat * mt = mats_of(c, unit);
        for (int k = 0; k < RM_XC_MATS; k++) c->st.bytes_read += mt[k].bytes;
    } else {
        release(c, s);
        c->st.read_errors++;
    }
    c->st.wait_us += (uint64_t) (rm_now_us() - t0);
    pthread_cond_broadcast(&c->done);
    pthread_mutex_unlock(&c->mu);
    if (st == RM_OK) {
        views(c, unit, p, out);
    }
    return st;
}

void rm_xcache_prefetch(rm_xcache * c, int il, const int32_t * experts, int32_t n, int res) {
    if (!c->has_reader) {
        return;
    }
    pthread_mutex_lock(&c->mu);
    int queued = 0;
    for (int32_t j = 0; j < n; j++) {
        for (int tier = 0; tier <= (res && c->files[1].path ? 1 : 0); tier++) {
            const int32_t unit = unit_of(c, il, experts[j], tier);
            if (c->where[unit] >= 0) {
                c->used[c->where[unit]] = ++c->tick;   /* wanted soon: not the next to leave */
                continue;
            }
            /* half the slots stay the window's; the reader takes what the window leaves */
            const int32_t s = c->q_n + 1 < c->n_slots - c->window ? victim(c) : -1;
            if (s < 0) {
                j = n;
                break;
            }
            assign(c, s, unit);
            c->queue[(c->q_head + c->q_n) % c->n_slots] = unit;
            c->q_n++;
            queued = 1;
        }
    }
    if (queued) {
        pthread_cond_signal(&c->work);
    }
    pthread_mutex_unlock(&c->mu);
}

void rm_xcache_stats(const rm_xcache * c, rm_expert_cache_stats * out) {
    pthread_mutex_lock((pthread_mutex_t *) &c->mu);
    const uint32_t size = out->struct_size;
    *out = c->st;
    out->struct_size = size;
    pthread_mutex_unlock((pthread_mutex_t *) &c->mu);
}

/* The (layer, tier)'s matrices: their file places and their regions in a slot; returns the slot
 * bytes they take. */
static uint64_t layout(rm_xcache * c, int il, int tier, const rm_weight * const ws[RM_XC_MATS]) {
    uint64_t at = 0;
    for (int k = 0; k < RM_XC_MATS; k++) {
        xc_mat * x = &c->mats[((int64_t) il * 2 + tier) * RM_XC_MATS + k];
        memset(x, 0, sizeof(*x));
        const rm_weight * w = ws[k];
        if (!w || !w->data) {
            continue;
        }
        x->file = tier;
        x->bytes = (uint64_t) w->ne[1] * w->row_bytes;
        x->off0 = (uint64_t) (w->data - c->files[tier].map);
        x->at = at;
        x->w = *w;
        x->w.ne[2] = 1;
        x->w.data = NULL;
        at += round_up(x->bytes, XC_ALIGN) + XC_ALIGN;   /* room for the read's leading part before the matrix */
    }
    return at;
}

rm_status rm_xcache_open(const rm_model * m, const char * path, const char * res_path, uint64_t cache_bytes,
                         int32_t min_slots, int prefetch, rm_xcache ** out) {
    *out = NULL;
    rm_xcache * c = calloc(1, sizeof(*c));
    if (!c) {
        return rm_fail(RM_E_OOM, "rm_model_load: out of memory for the expert cache");
    }
    c->files[0].fd = c->files[1].fd = c->files[0].fd_direct = c->files[1].fd_direct = -1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->io, NULL);
    pthread_cond_init(&c->work, NULL);
    pthread_cond_init(&c->done, NULL);
    const rm_hparams * hp = &m->hp;
    c->n_layer = hp->n_layer, c->n_expert = hp->n_expert;
    c->n_units = c->n_layer * c->n_expert * 2;
    const char * paths[2] = {path, res_path};
    const rm_gguf * gs[2] = {m->base, m->residual};
    for (int f = 0; f < 2; f++) {
        if (!paths[f]) {
            continue;
        }
        c->files[f].map = rm_gguf_map(gs[f]);
        c->files[f].path = strdup(paths[f]);
        c->files[f].fd = open_file(paths[f], 0);
        c->files[f].fd_direct = getenv("RAPIDMOE_NO_DIRECT_IO") ? -1 : open_file(paths[f], 1);
        c->files[f].direct = c->files[f].fd_direct >= 0;
        if (!c->files[f].path || c->files[f].fd < 0) {
            rm_xcache_free(c);
            return rm_fail(RM_E_IO, "rm_model_load: %s: cannot open for the expert cache: %s", paths[f], strerror(errno));
        }
    }
    c->mats = calloc((size_t) c->n_layer * 2 * RM_XC_MATS, sizeof(xc_mat));
    if (!c->mats) {
        rm_xcache_free(c);
        return rm_fail(RM_E_OOM, "rm_model_load: out of memory for the expert cache");
    }
    for (int il = 0; il < c->n_layer; il++) {
        const rm_layer * L = &m->layers[il];
        const rm_weight * base[RM_XC_MATS] = {&L->gate_exps, &L->up_exps, &L->down_exps, &L->gate_up_exps};
        const rm_weight * res[RM_XC_MATS] = {&L->gate_res, &L->up_res, &L->down_res, NULL};
        const uint64_t b = layout(c, il, RM_XC_BASE, base), r = res_path ? layout(c, il, RM_XC_RES, res) : 0;
        c->slot_bytes = b > c->slot_bytes ? b : c->slot_bytes;
        c->slot_bytes = r > c->slot_bytes ? r : c->slot_bytes;
    }
    const uint64_t slots = c->slot_bytes ? cache_bytes / c->slot_bytes : 0;
    if (slots < (uint64_t) min_slots) {
        const uint64_t need = (uint64_t) min_slots * c->slot_bytes;
        rm_xcache_free(c);
        return rm_fail(RM_E_INVALID_ARG, "rm_model_load: the RAM budget leaves %" PRIu64 " bytes for the expert cache, "
                       "below the %" PRIu64 " its %d smallest slots need (%" PRIu64 " bytes each: one expert's matrices)",
                       cache_bytes, need, min_slots, c->slot_bytes);
    }
    c->n_slots = slots > (uint64_t) c->n_units ? c->n_units : (int32_t) slots;
    c->window = prefetch ? (c->n_slots + 1) / 2 : c->n_slots;
    c->window = c->window < min_slots ? min_slots : c->window;
    c->cache_bytes = (uint64_t) c->n_slots * c->slot_bytes;
    void * mem = mmap(NULL, (size_t) c->cache_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    c->where = malloc(sizeof(int32_t) * (size_t) c->n_units);
    c->owner = malloc(sizeof(int32_t) * (size_t) c->n_slots);
    c->state = calloc((size_t) c->n_slots, 1);
    c->ahead = calloc((size_t) c->n_slots, 1);
    c->used = calloc((size_t) c->n_slots, sizeof(uint64_t));
    c->queue = calloc((size_t) c->n_slots, sizeof(int32_t));
    c->uses = calloc((size_t) c->n_units, sizeof(uint32_t));
    const char * pol = getenv("RAPIDMOE_XCACHE_POLICY");   /* for comparisons: lfu (default) or lru */
    c->lfu = !(pol && strcmp(pol, "lru") == 0);
    c->mem = mem == MAP_FAILED ? NULL : mem;
    if (!c->mem || !c->where || !c->owner || !c->state || !c->ahead || !c->used || !c->queue || !c->uses) {
        rm_xcache_free(c);
        return rm_fail(RM_E_OOM, "rm_model_load: out of memory for the expert cache's %" PRIu64 " bytes", cache_bytes);
    }
#ifdef MADV_HUGEPAGE
    madvise(c->mem, (size_t) c->cache_bytes, MADV_HUGEPAGE);
#endif
    memset(c->where, 0xff, sizeof(int32_t) * (size_t) c->n_units);
    memset(c->owner, 0xff, sizeof(int32_t) * (size_t) c->n_slots);
    c->window0 = c->tick = 1;
    c->st.streaming = 1;
    c->st.cache_bytes = c->cache_bytes;
    c->st.slot_bytes = c->slot_bytes;
    c->st.slots = c->n_slots;
    c->st.direct_io = c->files[0].direct;
    c->predict = prefetch == RM_PREFETCH_PREDICT;
    if (prefetch && c->n_slots > c->window) {
        c->has_reader = pthread_create(&c->reader, NULL, reader_main, c) == 0;
    }
    *out = c;
    return RM_OK;
}

void rm_xcache_free(rm_xcache * c) {
    if (!c) {
        return;
    }
    if (c->has_reader) {
        pthread_mutex_lock(&c->mu);
        c->stop = 1;
        pthread_cond_signal(&c->work);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->reader, NULL);
    }
    for (int f = 0; f < 2; f++) {
        if (c->files[f].fd >= 0) close(c->files[f].fd);
        if (c->files[f].fd_direct >= 0) close(c->files[f].fd_direct);
        free(c->files[f].path);
    }
    if (c->mem) munmap(c->mem, (size_t) c->cache_bytes);
    free(c->mats);
    free(c->where);
    free(c->owner);
    free(c->state);
    free(c->ahead);
    free(c->used);
    free(c->queue);
    free(c->uses);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->io);
    pthread_cond_destroy(&c->work);
    pthread_cond_destroy(&c->done);
    free(c);
}
