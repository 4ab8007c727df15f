/* tokenizer.h: the Hugging Face tokenizer.json byte-level BPE tokenizer
 * (the Qwen2/Qwen3 family): load, encode text to ids, decode ids to text,
 * and a streaming decoder that only ever emits complete UTF-8.
 *
 * What is supported (anything else fails at load with DFLASH_ERR_UNSUPPORTED
 * and a message naming the feature and the file):
 *   model        BPE (merges as "a b" strings or [a, b] pairs), no dropout,
 *                no subword prefix/suffix, no byte fallback
 *   normalizer   none, NFC, or a Sequence of those
 *   pre_tokenizer none, Split (Regex or String pattern; behavior Isolated or
 *                Removed; invert), ByteLevel (add_prefix_space false; with
 *                use_regex true the GPT-2 split regex is applied), Sequence.
 *                Regexes are read as HF's Oniguruma reads them where PCRE2
 *                differs: \s is Unicode White_Space (not U+180E), \h a hex
 *                digit, \v U+000B (see tokenizer.c)
 *   decoder      ByteLevel (or a Sequence holding only ByteLevel)
 *   added tokens matched before pre-tokenization, leftmost-longest; special,
 *                lstrip, rstrip and normalized honoured; single_word=true
 *                is refused, and so are two entries sharing an id or a
 *                content
 * The post_processor, truncation and padding sections are ignored: encode
 * behaves like HF's encode(text, add_special_tokens=False), which is what a
 * chat template renderer needs.
 *
 * Text input that is not valid UTF-8 is not an error: each maximal invalid
 * subsequence is replaced by U+FFFD before anything else (the same rule HF
 * uses when it decodes bytes to text), so any byte string encodes.
 *
 * Threads: encode uses per-handle scratch (regex match data, word cache), so
 * a handle is used by one thread at a time; decode only reads the handle. */
#ifndef DFLASH_IO_TOKENIZER_H
#define DFLASH_IO_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "dflash.h"

typedef struct dflash_tokenizer dflash_tokenizer;

/* path: a tokenizer.json file, or a folder holding one. */
dflash_status dflash_tokenizer_load(const char *path, dflash_tokenizer **out);
/* json[0..len): the file's content; label names it in error messages. */
dflash_status dflash_tokenizer_load_memory(const char *json, size_t len, const char *label,
                                           dflash_tokenizer **out);
void dflash_tokenizer_free(dflash_tokenizer *tok);

/* Encode text[0..len) (NUL bytes are ordinary characters). On success *ids
 * is a malloc'd array of *n ids (NULL when *n == 0) that the caller free()s.
 * No special tokens are added (HF's add_special_tokens=False). */
dflash_status dflash_tokenizer_encode(dflash_tokenizer *tok, const char *text, size_t len,
                                      int32_t **ids, size_t *n);
/* The same, with the special tokens the tokenizer's post-processor adds
 * around a text (HF's add_special_tokens=True: Llama 3's
 * <|begin_of_text|> first; nothing for Qwen3). */
dflash_status dflash_tokenizer_encode_special(dflash_tokenizer *tok, const char *text, size_t len,
                                              int32_t **ids, size_t *n);

enum {
    /* Leave out tokens marked "special" in added_tokens (HF's
     * skip_special_tokens); non-special added tokens such as <think> stay. */
    DFLASH_DECODE_SKIP_SPECIAL = 1u << 0,
};

/* Decode ids to UTF-8 like HF's ByteLevel decoder: the bytes of all tokens
 * are joined and invalid UTF-8 becomes U+FFFD. *out is malloc'd and
 * NUL-terminated (*len excludes the NUL). An id that names no token is an
 * error (DFLASH_ERR_INVALID_ARG; HF would drop it silently). */
dflash_status dflash_tokenizer_decode(const dflash_tokenizer *tok, const int32_t *ids, size_t n,
                                      uint32_t flags, char **out, size_t *len);

/* One past the largest id (model vocab and added tokens). */
int32_t dflash_tokenizer_vocab_size(const dflash_tokenizer *tok);
/* The id of a token as spelled in tokenizer.json (added-token content such as
 * "<|im_end|>", or a vocab key such as "Ġworld"); -1 if there is none. */
int32_t dflash_tokenizer_token_id(const dflash_tokenizer *tok, const char *token);
/* 1 if id names a token (decoding it is not an error), else 0. */
int dflash_tokenizer_has_id(const dflash_tokenizer *tok, int32_t id);
/* 1 if id is an added token marked special, else 0. */
int dflash_tokenizer_is_special(const dflash_tokenizer *tok, int32_t id);
/* 1 if id is one of added_tokens (matched whole, before pre-tokenization),
 * special or not, else 0. */
int dflash_tokenizer_is_added(const dflash_tokenizer *tok, int32_t id);
/* The label given at load (the file path). */
const char *dflash_tokenizer_label(const dflash_tokenizer *tok);

/* Streaming decoder: feed ids one at a time; each push returns the text that
 * became complete (possibly empty). A partial UTF-8 sequence is held until
 * it completes or is proven invalid; finish flushes what is held. The
 * concatenation of all outputs equals dflash_tokenizer_decode of the same ids
 * with the same flags. The returned pointer stays valid until the next call
 * on the stream. The tokenizer must outlive the stream. */
typedef struct dflash_detok_stream dflash_detok_stream;

dflash_status dflash_detok_stream_new(const dflash_tokenizer *tok, uint32_t flags,
                                      dflash_detok_stream **out);
dflash_status dflash_detok_stream_push(dflash_detok_stream *s, int32_t id, const char **text,
                                       size_t *len);
dflash_status dflash_detok_stream_finish(dflash_detok_stream *s, const char **text, size_t *len);
/* Forget held bytes and start over (a new sequence). */
void dflash_detok_stream_reset(dflash_detok_stream *s);
void dflash_detok_stream_free(dflash_detok_stream *s);

#endif
