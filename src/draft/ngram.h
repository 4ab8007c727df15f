/* ngram.h: prompt-lookup n-gram proposer: drafts the tokens that followed
 * the most recent earlier occurrence of the sequence's last n tokens. Needs
 * no weights and no taps; it proves the DraftProposer contract is general
 * and is the baseline DFlash is compared against. */
#ifndef DFLASH_DRAFT_NGRAM_H
#define DFLASH_DRAFT_NGRAM_H

#include "draft/proposer.h"

/* max_n: longest suffix tried (then shorter ones down to min_n). */
dflash_status dflash_ngram_create(int block_size, int min_n, int max_n, dflash_proposer **out);

#endif
