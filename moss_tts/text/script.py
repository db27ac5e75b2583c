"""Script and punctuation tables shared by the normalizer and the chunker (one copy each)."""

import re

# Scripts written without spaces between words: CJK ideographs (ext. A + basic) and kana.
CJK_CLASS = "\u3400-\u4dbf\u4e00-\u9fff\u3040-\u30ff"
# The chunker's notion of CJK also counts Hangul syllables (upstream's chunker does).
CJK_OR_HANGUL = re.compile(f"[{CJK_CLASS}\uac00-\ud7af]")

SENTENCE_END = frozenset(".!?。！？；;")
CLAUSE_END = frozenset(",，、；;：:")
# Closing quotes and brackets: a sentence mark takes the ones right after it into its piece,
# and a line whose last mark sits before them counts as punctuated. Upstream's chunker lacks
# the 〉 that its normalizer has; one table serves both here.
CLOSERS = frozenset("\"')]}）】》〉」』”’")
