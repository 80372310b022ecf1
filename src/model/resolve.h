/*
 * resolve - what a model reference on the command line names: a local path, or a model
 * already in the local Hugging Face hub cache, as vLLM users type it (`org/name`).
 *
 * Rules, in order (no network, ever):
 *   1. A path that exists (file or directory) is used as is: a local path always wins.
 *   2. A reference shaped like a Hub repo id, `name` or `org/name`, optionally `@rev`
 *      (letters, digits, '.', '_', '-'; no "..", no leading '.' or '-'), is looked up in the
 *      hub cache: $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub,
 *      else ~/.cache/huggingface/hub, under models--org--name/. The revision is `rev` or
 *      "main": a ref file refs/<rev> holds the commit, snapshots/<commit>/ the files
 *      (symlinks into blobs/, as huggingface_hub lays them out); `rev` may also be a
 *      commit directory under snapshots/ itself. Without refs/main, a repo holding exactly
 *      one snapshot uses it.
 *   3. The snapshot is the model when it has config.json (a Hugging Face directory);
 *      otherwise a snapshot holding exactly one *.gguf file resolves to that file.
 * Anything else is WELD_ERR_NOT_FOUND with a message naming what was typed, every place
 * looked, and what to do (download with `huggingface-cli download`, or give a path).
 */
#ifndef WELD_MODEL_RESOLVE_H
#define WELD_MODEL_RESOLVE_H

#include "core/err.h"

#include <stddef.h>

/* Write the local path `ref` names into out (cap bytes). WELD_OK, WELD_ERR_NOT_FOUND (the
   message says where weld looked), WELD_ERR_LIMIT (path longer than cap). */
int model_resolve_path(const char *ref, char *out, size_t cap, struct weld_err *e);

#endif
