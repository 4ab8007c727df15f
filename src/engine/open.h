/* open.h: opening what a run needs by name, shared by the library engine
 * (engine.c) and the CLI: the device's backend, the rows of the target's
 * forward, and the proposer a "drafter" argument names (a DFlash folder,
 * or "ngram"). */
#ifndef DFLASH_ENGINE_OPEN_H
#define DFLASH_ENGINE_OPEN_H

#include "backend/backend.h"
#include "draft/proposer.h"
#include "io/tokenizer.h"
#include "target/qwen3.h"

/* device "cpu"; "cuda" (must work: its failure is the error, prefixed
 * with `label`); "auto" (CUDA, else the CPU, logging why). */
dflash_status dflash_open_backend(const char *device, const char *label, dflash_backend **out);

/* The block (tokens per step: last token + drafts) a run with proposer
 * `draft` takes: 1 with none (NULL); "ngram": block_size, else 16; a
 * DFlash drafter folder: its config's block_size, capped by block_size
 * when that is set; at most DFLASH_MAX_BLOCK. *own: the drafter folder's
 * own block (DFLASH_MAX_BLOCK for a folder whose config is no drafter's,
 * which loading it refuses), 0 without a folder. Fails when the folder's
 * config.json cannot be read. */
dflash_status dflash_open_block(const char *draft, int block_size, int *block, int *own);

/* Rows a target forward takes when n_seqs sequences step together at up
 * to `block` rows each: all of them in one forward when it fits (the
 * weights are read once per forward; on the GPU a 512-row forward of a
 * Qwen3-8B costs ~5 one-row steps, not 32), never fewer than 64 (a
 * prefill chunk) nor more than 512. */
int dflash_open_target_rows(int n_seqs, int block);

/* The proposer `draft` names for `target`: "ngram" (prompt lookup, block
 * block_size or 16, n-grams of 1..3), else a DFlash drafter folder loaded
 * for the target's sequences and context (block_size 0: its own; ctx_cap
 * and quant as in dflash_head_opts). */
dflash_status dflash_open_proposer(const char *draft, dflash_qwen3 *target, int block_size, int ctx_cap, int quant,
                                   dflash_proposer **out);

/* Append id to ids[0..*n) (room for cap) unless it is there already or
 * negative. */
void dflash_stop_ids_add(int32_t *ids, int cap, int *n, int32_t id);

/* The model's end-of-sequence ids, without duplicates: its config.json's
 * (parsed into the target), then, with a tokenizer, those its
 * tokenizer_config / generation_config name (dflash_chat_eos_ids, whose
 * failure is returned: the config's ids are in place either way). */
dflash_status dflash_open_stop_ids(const dflash_qwen3 *target, const char *model_dir, const dflash_tokenizer *tok,
                                   int32_t *ids, int cap, int *n);

#endif
