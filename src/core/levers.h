/* levers.h: the environment switches, read once (on first use) into one
 * struct, so hot code never calls getenv. They diagnose and tune the one
 * release path; they never create alternate semantics. */
#ifndef DFLASH_CORE_LEVERS_H
#define DFLASH_CORE_LEVERS_H

typedef struct dflash_levers {
    int ctx_cap;      /* DFLASH_CTX_CAP: drafter context window in positions, 0 = none (default 4096) */
    int drafter_fp8;  /* DFLASH_DRAFTER_FP8=1 (or the seed's ATLAS_DFLASH_DRAFTER_FP8=1) */
    int log_level;    /* DFLASH_LOG: 0 quiet, 1 info (default), 2 debug */
    int cuda_pdl;     /* DFLASH_CUDA_PDL: 1 (default) programmatic dependent launch on sm_90+, 0 off (diagnosis) */
    int cuda_graphs;  /* DFLASH_CUDA_GRAPHS: 1 (default) forwards replayed from captured graphs, 0 off (diagnosis) */
    int host_sampling; /* DFLASH_HOST_SAMPLING=1: sampled tokens drawn row by row on the host from downloaded logits, never by the backend (diagnosis, A/B) */
    int host_drafts;   /* DFLASH_HOST_DRAFTS=1: a proposer's drafts come to the host before the verify (a second wait per step), never read by the verify where they are (diagnosis, A/B) */
    int cuda_gemm_split; /* DFLASH_CUDA_GEMM_SPLIT: 0 (default) split-K from the cost model, else this many slices (tuning) */
    int cuda_gemm_share_sum; /* DFLASH_CUDA_GEMM_SHARE_SUM: 1 (default) the slices of a split-K row block add its partials together where the whole grid fits the device at once, 0 the last slice alone, 2 the other slices leave their shares to the last one unless it came first (same bits; A/B and the fallback's check) */
    int cuda_qk_attention; /* DFLASH_CUDA_QK_ATTENTION: 1 (default) a decode's q/k norm + RoPE + K/V store run inside its attention launch where it can, 0 a launch of their own (same bits; A/B) */
    int cuda_attn_group;    /* DFLASH_CUDA_ATTN_GROUP: an attention block walks this many of the call's key splits (of its bound on the keys), 1..32; 0 (default) as many as one wave of blocks needs (same bits; tuning and checks) */
    int cuda_attn_min_warps; /* DFLASH_CUDA_ATTN_MIN_WARPS: warps of a tensor-core attention block, at least those its query tiles need, 1..8; 0 (default) its own choice (same bits; tuning and checks) */
    int cuda_gemm_defer_sum; /* DFLASH_CUDA_GEMM_DEFER_SUM: 1 (default) a split-K GEMM whose output only feeds the next launch (o and down before a norm, q/k/v before their norm and RoPE) leaves its partials' sum to that launch, 0 the GEMM adds them (same bits; A/B) */
    int cuda_route_sum_rows; /* DFLASH_CUDA_ROUTE_SUM_ROWS: calls of up to this many rows (0..64; default 1, a decode) have a MoE router's split-K GEMM leave its sum to the routing's launch, 0 never (same bits; A/B and tuning) */
    int cuda_gemm_wide;  /* DFLASH_CUDA_GEMM_WIDE: rows from which a GEMM takes the many-row kernel (default 65; same bits) */
    int cuda_gemm_tile;  /* DFLASH_CUDA_GEMM_TILE: the many-row kernel's activation tile, 32, 64 or 128; 0 (default) its own choice */
    int cuda_experts_tile;  /* DFLASH_CUDA_EXPERTS_TILE: the grouped expert GEMM's tile rows, 8, 16, 32 or 64; 0 (default) its own choice */
    int cuda_experts_chain; /* DFLASH_CUDA_EXPERTS_CHAIN: work items per block of the grouped expert GEMM, 1..8 (at most); 0 (default) its own choice */
    int cuda_experts_slice; /* DFLASH_CUDA_EXPERTS_SLICE: the grouped expert GEMM splits K into at most K / N slices, N in k-steps (64 bytes of a weight row); 0 (default) its own choice */
    int cpu_isa;      /* DFLASH_CPU_ISA: portable 0, avx2 1, avx512 2: the most the CPU linear may use; -1 = the best */
    int cpu_threads;  /* DFLASH_CPU_THREADS: threads of the CPU backend's pool; 0 = OMP_NUM_THREADS, else the cores */
} dflash_levers;

/* DFLASH_CPU_ISA's values, in the order of cpu_isa (and of the CPU
 * backend's dflash_cpu_isa). */
#define DFLASH_CPU_ISA_COUNT 3
extern const char *const dflash_cpu_isa_names[DFLASH_CPU_ISA_COUNT];

const dflash_levers *dflash_levers_get(void);
/* Re-read the environment (tests change variables between cases). */
void dflash_levers_reload(void);

#endif
