/* json_util.h: what the JSON-reading parsers (config, safetensors header,
 * tokenizer) share for their error messages. */
#ifndef DFLASH_IO_JSON_UTIL_H
#define DFLASH_IO_JSON_UTIL_H

#include <jansson.h>

/* "an object", "a string", ... for messages like "field x is a string". */
const char *dflash_json_type_name(const json_t *v);

#endif
