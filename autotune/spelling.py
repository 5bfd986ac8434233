"""Did you mean: the allowed names closest to a mistyped one, for the errors that refuse it.

Similarity is difflib's ratio (Ratcliff/Obershelp: twice the matching characters over all the
characters of both strings), computed on names folded to lower case without spaces, hyphens and
underscores, so that "T-4" reads as "T4" and "bert base uncased" as "bert-base-uncased". Pure
string work: no network, no imports beyond the standard library.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence

# A little above difflib.get_close_matches' 0.6: "bert-base-uncase" (0.97), "tiny-bret" (0.88) and
# "qwen2.5-7b-instruct" for the Qwen2.5-7B preset (0.69) pass; "bert-huge" against roberta-large
# (0.6) does not.
DEFAULT_CUTOFF = 0.65
MAX_SUGGESTIONS = 3
# Names much further than the best match are noise beside it: "bert-base-uncase" is
# bert-base-uncased (0.97), not also bert-base-cased (0.90).
WITHIN_BEST = 0.05
# A spelling that begins with what was typed, of at least this many characters, matches it as
# well as the same spelling would: "bert-large" names a family (bert-large-uncased, -cased), which
# ratio alone ranks below the shorter roberta-large (0.72 against 0.86).
MIN_PREFIX = 3


def fold(text: str) -> str:
    """Lower case without whitespace, hyphens and underscores: "T-4" -> "t4"."""
    return re.sub(r"[\s_-]+", "", text.strip().lower())


def close_matches(
    words: str | Sequence[str],
    forms: Iterable[tuple[str, str]],
    *,
    cutoff: float = DEFAULT_CUTOFF,
    limit: int = MAX_SUGGESTIONS,
) -> list[str]:
    """Up to ``limit`` names whose forms are closest to ``words``, best first (ties in the order of
    ``forms``).

    ``forms`` are (spelling, name) pairs: every spelling a name is known by (itself, an alias, its
    name without an organisation, ...) and the name to suggest for it. ``words`` are the ways to
    read what was typed (e.g. a hub id and its name without the organisation). A name scores its
    best over words and spellings: 1 for a spelling that begins with the word (MIN_PREFIX), else
    their ratio. It is suggested when that reaches ``cutoff`` and is within WITHIN_BEST of the
    best name's.
    """
    typed = [fold(w) for w in ([words] if isinstance(words, str) else words)]
    matcher = difflib.SequenceMatcher(autojunk=False)
    best: dict[str, float] = {}
    for spelling, name in forms:
        folded = fold(spelling)
        matcher.set_seq2(folded)
        for word in typed:
            if len(word) >= MIN_PREFIX and folded.startswith(word):
                score = 1.0
            else:
                matcher.set_seq1(word)
                # real_quick_ratio and quick_ratio bound ratio from above: cheap rejections first.
                if matcher.real_quick_ratio() < cutoff or matcher.quick_ratio() < cutoff:
                    continue
                score = matcher.ratio()
            if score >= cutoff and score > best.get(name, 0.0):
                best[name] = score
    if not best:
        return []
    top = max(best.values())
    ranked = sorted(best, key=lambda name: -best[name])  # stable: ties keep the order of forms
    return [name for name in ranked if best[name] >= top - WITHIN_BEST][:limit]


def did_you_mean(names: Sequence[str]) -> str:
    """"did you mean A?", "did you mean A or B?", "did you mean A, B or C?"; "" without names."""
    if not names:
        return ""
    if len(names) == 1:
        return f"did you mean {names[0]}?"
    return f"did you mean {', '.join(names[:-1])} or {names[-1]}?"
