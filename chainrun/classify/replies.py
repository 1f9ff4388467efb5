"""Reading the shopper's reply to a question chainrun asked: yes, no, unclear or a new
request.

When an action waits for the shopper's yes (:mod:`chainrun.tools.confirm`), the next
message is read here. Two layers, the precise one first:

1. **Rules** (:meth:`ReplyReader.by_rules`, microseconds, no model): the message is cut
   into known phrases of six languages (English, German, French, Spanish, Italian,
   Dutch; :data:`PHRASES`) and emoji (👍 ✅ 👌 yes, 👎 ❌ no).

   - Made only of known phrases: any doubt ("maybe", "not sure", "vielleicht", "no sé")
     is ``unclear``; else any negation ("no", "don't", "nein", "pas maintenant", "nee")
     is ``no``; else an affirmation ("yes", "sure why not", "ja bitte", "d'accord",
     "claro", "va bene", "doe maar", "👍") is ``yes``; politeness alone ("please",
     "thanks") is ``unclear``. A yes and a no together ("yes no"), or a yes with a
     question mark ("yes?"), are ``unclear``.
   - A leading affirmation followed by more words ("yes add it to my cart", "yeah go
     ahead and place it", "ja, leg sie in den Warenkorb") is ``yes`` when every further
     word is one a confirmation uses (:data:`CONFIRMING_WORDS`: add, cart, go ahead,
     Warenkorb, panier, ...) or a word of the question asked (``context``: its product
     id, its quantity), and nothing doubts, negates or bargains ("but", "if", "aber",
     "mais", "instead", a question mark).
   - A leading affirmation that bargains, doubts or negates ("yes if it's under 50",
     "yes but only one") or names a number or product id the question did not ("yes, 3
     of them") is ``unclear``.
   - A word of contrast or change with a request and no yes or no ("add the blue one
     instead", "only the black one") is a ``new_request``.
   - A leading negation followed only by filler or the question's words ("hold off on
     that", "don't add it") is ``no``; followed by a request ("no, show me the cheaper
     one"), a ``new_request`` that negates (``detail["negated"]``).

2. **Nearest examples** (MiniLM, as the classify step: :class:`NearestExamples`) for the
   rest: CLINC150's training replies (``yes``, ``no``, ``maybe``, ``cancel``), replies
   written for chainrun, and the shop's requests (the classify step's examples the team
   wrote) as ``new_request``. Their ``yes`` is taken only when it is clear (a vote share
   of at least :data:`YES_SHARE`, the nearest yes example at least :data:`YES_SIMILARITY`
   similar) and the message holds no negation, doubt, condition or question mark;
   anything less sure is ``unclear`` (asked again). Without MiniLM installed, a message
   the rules do not read is ``unclear`` when short, a ``new_request`` when it has at
   least :data:`REQUEST_WORDS` words.

The bias is deliberate: a yes read as unclear costs the shopper one more "yes"; a no read
as yes costs an order. How often each happens is measured on a public corpus's test split
and on replies written for the purpose (``benchmarks/confirm_replies.py``).
"""

from __future__ import annotations

import asyncio
import json
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np

from chainrun.classify.examples import DEFAULT_EXAMPLES, NearestExamples, seeded_vectors
from chainrun.retrieval.embeddings import Embedder, MiniLMEmbedder

__all__ = [
    "CONFIRMING_WORDS",
    "PHRASES",
    "REPLY_EXAMPLES",
    "REPLY_LABELS",
    "ReplyLabel",
    "ReplyReader",
    "ReplyReading",
    "default_reader",
    "words_of",
]

#: how a reply reads
ReplyLabel = Literal["yes", "no", "unclear", "new_request"]
REPLY_LABELS: tuple[ReplyLabel, ...] = ("yes", "no", "unclear", "new_request")

#: labelled replies: JSONL ``{"label": one of REPLY_LABELS, "message": ...}``, rows of a
#: public corpus naming their ``source`` (CLINC150 train: evals/corpora/clinc150)
REPLY_EXAMPLES = Path(__file__).resolve().parent.parent / "data" / "reply_examples.jsonl"
#: all-MiniLM-L6-v2 vectors of :data:`REPLY_EXAMPLES` (``benchmarks/make_classify_vectors.py``)
REPLY_VECTORS = REPLY_EXAMPLES.with_name("reply_examples.minilm.npz")

#: the examples' ``yes`` counts only with at least this share of the neighbours' votes ...
YES_SHARE = 0.8
#: ... and the nearest ``yes`` example at least this similar (cosine, MiniLM)
YES_SIMILARITY = 0.7
#: a reply the rules do not read and no example decides is a new request from this many
#: words (fewer: unclear, asked again)
REQUEST_WORDS = 4
#: neighbours that vote
REPLY_K = 7
#: words of a statement that may stand beside an affirmation ("what you just said is
#: true", "my answer to your question is yes", "that would be great")
STATEMENT_WORDS = frozenset("""
that is was be been would will it's its this i i'd id i'll say said my answer response
reply to your the question a an are am as so very much quite totally completely for what
you just statement resounding thing think believe from me
""".split())
#: affirmations that count anywhere in a sentence (not only first), as "yes" in "my answer
#: is yes"; "si" and "ja" are not among them (Spanish "if", a German particle)
_ANYWHERE_YES = frozenset(["yes", "yeah", "yep", "yup", "affirmative", "oui", "sim"])
_NUMBER = re.compile(r"\d")

#: words that may follow a leading no and keep it a plain no ("hold off on that"), with
#: the words of the question asked ("don't add it"); other words make it a new request
#: that negates ("no, show me the cheaper one")
_AFTER_NO = frozenset("on that this it one ones now please thanks for me them those the "
                      "to do that's".split())

# Phrase categories: Y affirms, N negates, U doubts, F is politeness or a filler word,
# C bargains (a condition or a contrast: a yes with it is no yes).
_Y, _N, _U, _F, _C = "Y", "N", "U", "F", "C"

#: phrase → category, by language; accents and case are folded before matching
#: (:func:`words_of`), longest phrase first
PHRASES: dict[str, dict[str, str]] = {
    "en": {
        **dict.fromkeys([
            "yes", "y", "yeah", "yea", "ya", "yep", "yup", "yeap", "yess", "sure", "ok", "okay",
            "okey", "k", "kk", "alright", "all right", "right", "correct", "absolutely",
            "definitely", "certainly", "of course", "indeed", "affirmative", "confirm",
            "confirmed", "i confirm", "go ahead", "go for it", "go on", "do it", "please do",
            "do that", "let's do it", "lets do it", "let's go", "sounds good",
            "sounds great", "sounds perfect", "that's fine", "thats fine", "fine", "fine by me",
            "perfect", "great", "good", "excellent", "awesome", "cool", "lovely", "agreed",
            "i agree", "deal", "why not", "sure why not", "no problem", "no worries",
            "sure thing", "that's right", "thats right", "that's it", "that's correct",
            "exactly", "true", "uh-huh", "yes please", "please yes", "proceed", "roger",
            "roger that", "10-4", "works for me", "that works", "i do", "yes i do",
            "go", "approve", "approved", "accept", "accepted", "done", "why not",
            "accurate", "fact", "a fact", "factual", "the truth", "checks out",
            "that checks out", "you're right", "you are right", "that's true", "thats true",
            "that's correct", "thats correct", "that is correct", "that is right",
            "that is true",
        ], _Y),
        **dict.fromkeys([
            "no", "n", "nope", "nah", "nay", "negative", "not", "don't", "dont", "do not",
            "never", "cancel", "cancel it", "cancel that", "stop", "abort", "halt",
            "no thanks", "no thank you", "not now", "not right now", "not yet",
            "not today", "no way", "of course not", "definitely not", "certainly not",
            "absolutely not", "never mind", "nevermind", "forget it", "forget that",
            "leave it", "skip it", "skip", "pass", "i'll pass", "hold off", "rather not",
            "i'd rather not", "no need", "i'm good", "im good", "i am good", "wrong",
            "incorrect", "false", "not interested", "changed my mind", "i changed my mind",
            "undo", "don't do it", "dont do it", "no don't", "please don't", "please dont",
            "isn't", "isnt", "is not", "aren't", "wasn't", "can't", "cant", "cannot", "won't",
            "wont", "doesn't", "doesnt", "didn't", "didnt", "wouldn't", "shouldn't", "nothing",
            "none", "neither", "nor", "negatory", "falsehood",
        ], _N),
        **dict.fromkeys([
            "maybe", "perhaps", "possibly", "probably", "not sure", "unsure", "dunno",
            "i dunno", "i don't know", "i dont know", "idk", "don't know", "no idea",
            "hmm", "hm", "hmmm", "um", "uh", "er", "wait", "hold on", "let me think",
            "i guess", "i think", "might", "could be", "who knows", "not certain",
            "undecided", "later", "perhaps later", "maybe later", "i'm not sure",
            "im not sure", "i am not sure", "let me think about it", "think about it",
        ], _U),
        **dict.fromkeys([
            "please", "pls", "plz", "thanks", "thank you", "thx", "ty", "cheers", "oh",
            "well", "then", "so", "now", "just", "really", "yes yes", "haha",
            "lol", "hi", "hey", "that", "it", "that's", "that is", "this",
        ], _F),
        **dict.fromkeys(["but", "if", "unless", "only if", "except", "instead", "as long as",
                         "provided", "actually", "though", "although", "however", "rather",
                         "change", "different", "another", "else", "only"], _C),
    },
    "de": {
        **dict.fromkeys([
            "ja", "jawohl", "jap", "jep", "jo", "klar", "na klar", "sicher", "gerne", "gern",
            "ja gerne", "ja bitte", "bitte ja", "genau", "passt", "passt so", "einverstanden",
            "mach das", "mach es", "machen", "mach", "auf jeden fall", "natürlich",
            "selbstverständlich", "in ordnung", "alles klar", "geht klar", "los", "leg los",
            "richtig", "stimmt", "korrekt", "warum nicht", "gut", "sehr gut", "super",
            "perfekt", "prima", "bestätigen", "bestätigt", "ich bestätige", "okay", "ok",
            "jawoll", "freilich", "sicherlich", "kein problem", "kein thema",
        ], _Y),
        **dict.fromkeys([
            "nein", "nee", "ne", "nö", "nicht", "kein", "keine", "nicht jetzt", "abbrechen",
            "stornieren", "storniere", "stopp", "lieber nicht", "auf keinen fall",
            "niemals", "nie", "vergiss es", "falsch", "nein danke", "noch nicht",
            "lass es", "lass das", "nichts",
        ], _N),
        **dict.fromkeys([
            "vielleicht", "weiß nicht", "weiss nicht", "ich weiß nicht", "ich weiss nicht",
            "keine ahnung", "mal sehen", "moment", "warte", "eventuell", "vermutlich",
            "kann sein", "bin nicht sicher", "nicht sicher", "ich bin mir nicht sicher",
        ], _U),
        **dict.fromkeys(["bitte", "danke", "danke schön", "dankeschön", "vielen dank", "also",
                         "dann", "doch", "na"], _F),
        **dict.fromkeys(["aber", "wenn", "falls", "sofern", "außer", "stattdessen", "statt"],
                        _C),
    },
    "fr": {
        **dict.fromkeys([
            "oui", "ouais", "ouaip", "bien sûr", "bien sur", "d'accord", "dac", "daccord",
            "ok", "okay", "vas-y", "vas y", "allez-y", "allez y", "volontiers",
            "avec plaisir", "exactement", "c'est ça", "c'est ca", "parfait", "très bien",
            "tres bien", "pourquoi pas", "carrément", "absolument", "tout à fait",
            "certainement", "je confirme", "confirmé", "ça marche", "ca marche", "entendu",
            "oui oui", "bien", "super", "génial", "nickel", "c'est bon", "c'est parfait",
            "pas de problème", "pas de souci", "pas de soucis",
        ], _Y),
        **dict.fromkeys([
            "non", "nan", "pas", "ne", "pas maintenant", "annuler", "annule", "arrête",
            "arrete", "stop", "surtout pas", "jamais", "laisse tomber", "non merci",
            "faux", "pas encore", "pas question", "certainement pas", "ne le fais pas", "rien",
        ], _N),
        **dict.fromkeys([
            "peut-être", "peut-etre", "peut être", "peut etre", "je ne sais pas",
            "je sais pas", "sais pas", "je sais pas trop", "attends", "on verra",
            "probablement", "pas sûr", "pas sur", "je ne suis pas sûr",
        ], _U),
        **dict.fromkeys(["merci", "s'il vous plaît", "s'il vous plait", "s'il te plaît",
                         "s'il te plait", "svp", "stp", "alors", "bon", "eh bien"], _F),
        **dict.fromkeys(["mais", "si seulement", "à condition", "a condition", "sauf",
                         "plutôt", "plutot", "au lieu"], _C),
    },
    "es": {
        **dict.fromkeys([
            "sí", "si", "claro", "claro que sí", "vale", "dale", "de acuerdo", "por supuesto",
            "perfecto", "correcto", "adelante", "hazlo", "confirmo", "confirmado", "seguro",
            "ok", "okay", "bueno", "venga", "por qué no", "porque no", "exacto", "genial",
            "sí claro", "muy bien", "bien", "desde luego", "está bien", "esta bien",
            "no hay problema", "sin problema",
        ], _Y),
        **dict.fromkeys([
            "no", "nada", "cancelar", "cancela", "cancélalo", "para", "nunca", "ni hablar",
            "déjalo", "dejalo", "mejor no", "todavía no", "todavia no", "incorrecto",
            "no gracias", "ahora no", "de ninguna manera", "ninguno", "ninguna",
        ], _N),
        **dict.fromkeys([
            "quizás", "quizas", "quizá", "quiza", "tal vez", "a lo mejor", "no sé", "no se",
            "no lo sé", "no lo se", "espera", "puede ser", "no estoy seguro",
            "no estoy segura",
        ], _U),
        **dict.fromkeys(["por favor", "gracias", "muchas gracias", "pues", "entonces"], _F),
        **dict.fromkeys(["pero", "solo si", "siempre que", "excepto", "en vez", "en lugar",
                         "mejor"], _C),
    },
    "it": {
        **dict.fromkeys([
            "sì", "si", "certo", "certamente", "va bene", "d'accordo", "daccordo", "ok",
            "okay", "perfetto", "esatto", "giusto", "procedi", "vai", "confermo",
            "confermato", "assolutamente", "volentieri", "perché no", "perche no",
            "ovviamente", "certo che sì", "sì grazie", "benissimo", "bene", "ottimo",
            "fallo", "sicuro", "nessun problema",
        ], _Y),
        **dict.fromkeys([
            "no", "annulla", "annullare", "ferma", "stop", "mai", "lascia perdere",
            "meglio di no", "non ancora", "non", "sbagliato", "no grazie", "non ora",
            "neanche per sogno", "per niente", "niente", "nessuno",
        ], _N),
        **dict.fromkeys([
            "forse", "non so", "boh", "aspetta", "può darsi", "puo darsi", "vediamo",
            "magari", "chissà", "chissa", "non sono sicuro", "non sono sicura",
        ], _U),
        **dict.fromkeys(["per favore", "grazie", "grazie mille", "allora", "beh"], _F),
        **dict.fromkeys(["però", "pero", "solo se", "purché", "purche", "invece",
                         "piuttosto"], _C),
    },
    "pt": {
        **dict.fromkeys(["sim", "claro", "com certeza", "pode", "certo", "ok", "beleza",
                         "combinado", "perfeito", "sim por favor", "por que nao"], _Y),
        **dict.fromkeys(["nao", "não", "nao obrigado", "nao obrigada", "agora nao", "nunca",
                         "cancela", "cancelar"], _N),
        **dict.fromkeys(["talvez", "nao sei", "não sei", "espera"], _U),
        **dict.fromkeys(["obrigado", "obrigada", "por favor"], _F),
        **dict.fromkeys(["mas", "se", "em vez"], _C),
    },
    "nl": {
        **dict.fromkeys([
            "ja", "jazeker", "jawel", "zeker", "prima", "goed", "oké", "oke", "ok", "okay",
            "akkoord", "doe maar", "graag", "ja graag", "natuurlijk", "klopt", "juist",
            "correct", "bevestig", "bevestigd", "waarom niet", "top", "ga je gang",
            "helemaal goed", "prima zo", "is goed", "uitstekend", "zeker weten",
            "geen probleem",
        ], _Y),
        **dict.fromkeys([
            "nee", "neen", "niet", "geen", "annuleer", "annuleren", "stop", "nooit",
            "laat maar", "liever niet", "nog niet", "fout", "niet doen", "nee dank je",
            "nee bedankt", "nu niet", "geen sprake van", "niets",
        ], _N),
        **dict.fromkeys([
            "misschien", "weet niet", "weet ik niet", "ik weet het niet", "geen idee",
            "wacht", "even denken", "mogelijk", "wellicht", "niet zeker",
        ], _U),
        **dict.fromkeys(["alsjeblieft", "alstublieft", "dank je", "dank je wel", "bedankt",
                         "dank u", "dan", "nou"], _F),
        **dict.fromkeys(["maar", "als", "tenzij", "behalve", "liever", "in plaats"], _C),
    },
}

#: words that may follow a leading yes without making it less of a yes ("yes add it to my
#: cart", "ja, leg sie in den Warenkorb"); with the words of the question asked
CONFIRMING_WORDS = frozenset("""
add it them those these that this one ones both all to my the a an in into on for and
cart basket bag trolley order orders buy purchase place put go ahead do please now
thanks thank you i want want would like i'd id want them that's want it yes ok
please me us we our will take get send checkout pay book reserve confirm keep
is are be fine great right sounds good perfect one both of with x
leg lege sie ihn es in den die das warenkorb korb bestellen bestell kaufen mach
bitte danke ja und legen packen pack tu
ajoute ajouter mets mettre les le la dans mon ma panier commande commander acheter
ajoute-les mets-les et merci oui au aux
anade añade añadelos añádelos anadelos agrega agregalos ponlos pon los las el la al en mi
carrito cesta pedido compra comprar y gracias
aggiungi aggiungili aggiungile metti mettili nel nella il lo la carrello ordine ordina
comprare e grazie
zet ze het de in mijn winkelwagen winkelmandje mand bestel bestellen kopen en graag
doe voeg toe
""".split())

_EMOJI_YES = frozenset("👍✅✔☑👌🆗🙆💯🤝👏")
_EMOJI_NO = frozenset("👎❌✖🚫⛔🙅❎")
_SKIN_AND_JOINERS = re.compile("[\U0001f3fb-\U0001f3ff\ufe0f\ufe0e\u200d]")
_WORD = re.compile(r"[a-z0-9]+(?:['-][a-z0-9]+)*")
#: the longest phrase, in words
_MAX_PHRASE = 5


def _fold(text: str) -> str:
    """Lower case, curly apostrophes straightened, accents dropped, ß as ss."""
    text = unicodedata.normalize("NFKC", text).lower().replace("’", "'").replace("ß", "ss")
    decomposed = unicodedata.normalize("NFD", text)
    return "".join(c for c in decomposed if unicodedata.category(c) != "Mn")


def words_of(text: str) -> list[str]:
    """The words of ``text`` as the rules read them: folded (:func:`_fold`), split on
    anything but letters, digits and inner apostrophes or hyphens."""
    return _WORD.findall(_fold(text))


def _phrase_table() -> dict[tuple[str, ...], str]:
    table: dict[tuple[str, ...], str] = {}
    for phrases in PHRASES.values():
        for phrase, category in phrases.items():
            key = tuple(words_of(phrase))
            # a phrase two languages share keeps its strongest reading: doubt, then no
            old = table.get(key)
            if old is None or "UNYFC".index(category) < "UNYFC".index(old):
                table[key] = category
    return table


_TABLE = _phrase_table()
_CONFIRMING = frozenset(w for phrase in CONFIRMING_WORDS for w in words_of(phrase))


def _segments(words: Sequence[str]) -> list[tuple[str, str | None]]:
    """``words`` cut into the longest known phrases: (phrase, category or None)."""
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(words):
        for n in range(min(_MAX_PHRASE, len(words) - i), 0, -1):
            category = _TABLE.get(tuple(words[i : i + n]))
            if category is not None:
                out.append((" ".join(words[i : i + n]), category))
                i += n
                break
        else:
            out.append((words[i], None))
            i += 1
    return out


def _emoji(message: str) -> tuple[int, int, str]:
    """(yes emoji, no emoji, the message without them)."""
    text = _SKIN_AND_JOINERS.sub("", message)
    yes = sum(ch in _EMOJI_YES for ch in text)
    no = sum(ch in _EMOJI_NO for ch in text)
    rest = "".join(ch for ch in text if ch not in _EMOJI_YES and ch not in _EMOJI_NO)
    return yes, no, rest


@dataclass(frozen=True)
class ReplyReading:
    """How one reply reads.

    Attributes:
        label: ``yes``, ``no``, ``unclear`` or ``new_request``.
        decided_by: ``rules`` (known phrases and emoji), ``leading`` (a leading yes or no
            and more words), ``examples`` (the nearest labelled replies), ``length`` (no
            rule or example decided: its word count did).
        detail: what was seen: ``segments`` (phrase, category), ``negated`` (a new
            request that began with a no), ``shares`` and ``nearest`` (examples).
    """

    label: ReplyLabel
    decided_by: str
    detail: dict[str, Any] = field(default_factory=dict)


class ReplyReader:
    """The reader of replies (see the module docstring).

    Args:
        examples: (label, message) pairs of labelled replies (None: :data:`REPLY_EXAMPLES`
            and, as ``new_request``, the classify step's examples the team wrote; empty:
            no examples, the rules and the word count only).
        embedder: the embedder of the examples (None: MiniLM when its files are installed,
            else no examples: rules and word count only).
        k: neighbours that vote.
    """

    def __init__(
        self,
        examples: Sequence[tuple[str, str]] | None = None,
        embedder: Embedder | None = None,
        *,
        k: int = REPLY_K,
    ) -> None:
        self._given = examples
        if embedder is None and MiniLMEmbedder.available():
            embedder = MiniLMEmbedder()
        self.embedder = embedder
        self.k = k
        self._nearest: NearestExamples | None = None
        self._lock = asyncio.Lock()

    async def warm(self) -> None:
        """Read and embed the examples now (else the first :meth:`read` that needs them
        does): the shipped examples' vectors ship beside them."""
        if self.embedder is None or self._nearest is not None or self._given == []:
            return
        async with self._lock:
            if self._nearest is None:
                examples = self._given
                if examples is None:
                    examples = await asyncio.to_thread(shipped_examples)
                nearest = NearestExamples(REPLY_LABELS, examples, self.embedder, k=self.k,
                                          vectors=await self._vectors(examples),
                                          out_of_scope_below=0.0)  # fmt: skip
                await nearest.warm()
                self._nearest = nearest

    async def _vectors(self, examples: Sequence[tuple[str, str]]) -> np.ndarray | None:
        """The shipped vectors of ``examples`` when every one has one (else None: embedded
        on warm)."""
        if not isinstance(self.embedder, MiniLMEmbedder):
            return None
        messages = [m for _, m in examples]
        rows: dict[int, np.ndarray] = {}
        for seeds in (REPLY_VECTORS, DEFAULT_EXAMPLES.with_name("classify_examples.minilm.npz")):
            found = await asyncio.to_thread(seeded_vectors, self.embedder.model, messages, seeds)
            rows.update(found)
        if len(rows) != len(messages):
            return None
        return np.stack([rows[i] for i in range(len(messages))])

    def by_rules(self, message: str, context: Iterable[str] = ()) -> ReplyReading | None:
        """The rules' reading of ``message`` (None: the rules do not decide). ``context``:
        texts whose words may follow a leading yes (the question asked, its arguments)."""
        yes_emoji, no_emoji, text = _emoji(message)
        words = words_of(text)
        segments: list[tuple[str, str | None]] = []
        if yes_emoji:
            segments.append(("emoji:yes", _Y))
        if no_emoji:
            segments.append(("emoji:no", _N))
        segments += _segments(words)
        detail: dict[str, Any] = {"segments": segments}
        if not segments:
            return ReplyReading("unclear", "rules", detail)
        kinds = [c for _, c in segments]
        vetoed = bool({_N, _U, _C} & set(kinds)) or "?" in message
        if None not in kinds:
            if _U in kinds or (_Y in kinds and _N in kinds):
                return ReplyReading("unclear", "rules", detail)
            if _N in kinds:
                return ReplyReading("no", "rules", detail)
            if _Y in kinds and _C not in kinds and "?" not in message:
                return ReplyReading("yes", "rules", detail)
            return ReplyReading("unclear", "rules", detail)  # politeness or a condition alone
        lead = next((c for c in kinds if c != _F), None)
        rest = [p for p, c in segments if c is None]
        told = {w for text in context for w in words_of(text)}
        if _Y in kinds and not vetoed:
            # a number or product id the question did not hold is a different request
            numbers_ok = all(p in told for p in rest if _NUMBER.search(p))
            if lead == _Y and numbers_ok:
                return ReplyReading("yes", "leading", detail)
            allowed = _CONFIRMING | STATEMENT_WORDS | told
            strong = any(p in _ANYWHERE_YES for p, c in segments if c == _Y)
            if numbers_ok and (strong or all(p in allowed for p in rest)):
                return ReplyReading("yes", "rules", detail)
            if lead == _Y:  # a yes with another number: not this action as asked
                return ReplyReading("unclear", "leading", detail)
            return None
        if lead == _Y:  # a yes with a condition, a doubt or a no: asked again
            return ReplyReading("unclear", "leading", detail)
        if _C in kinds and _Y not in kinds and _N not in kinds and len(rest) >= 2:
            # a contrast or change with a request: "add the blue one instead"
            return ReplyReading("new_request", "rules", detail)
        if lead == _N and _Y not in kinds:
            if all(p in _AFTER_NO or p in told for p in rest):
                return ReplyReading("no", "leading", detail)
            return ReplyReading("new_request", "leading", {**detail, "negated": True})
        return None

    async def read(self, message: str, context: Iterable[str] = ()) -> ReplyReading:
        """How ``message`` reads (see the module docstring)."""
        context = list(context)
        ruled = self.by_rules(message, context)
        if ruled is not None:
            return ruled
        segments = _segments(words_of(_emoji(message)[2]))
        kinds = {c for _, c in segments}
        n_words = len(words_of(message))
        await self.warm()
        if self._nearest is not None:
            found = await self._nearest.classify(message)
            shares = found.confidences
            nearest = found.detail.get("nearest", [])
            detail = {"segments": segments, "shares": shares, "nearest": nearest[:3]}
            label = found.label
            if label == "yes":
                best_yes = max((n["similarity"] for n in nearest if n["label"] == "yes"),
                               default=0.0)  # fmt: skip
                told = {w for text in context for w in words_of(text)}
                other_number = any(_NUMBER.search(w) and w not in told
                                   for w in words_of(message))  # fmt: skip
                clear = (shares.get("yes", 0.0) >= YES_SHARE and best_yes >= YES_SIMILARITY
                         and not ({_N, _U, _C} & kinds) and "?" not in message
                         and not other_number)  # fmt: skip
                if clear:
                    return ReplyReading("yes", "examples", detail)
                # like a yes, but to another quantity or product: a request of its own
                wanted: ReplyLabel = (
                    "new_request" if other_number and n_words >= REQUEST_WORDS else "unclear")
                return ReplyReading(wanted, "examples", detail)
            if label in ("no", "unclear") or n_words >= REQUEST_WORDS:
                return ReplyReading(cast(ReplyLabel, label), "examples", detail)
            return ReplyReading("unclear", "examples", detail)
        by_length: ReplyLabel = "new_request" if n_words >= REQUEST_WORDS else "unclear"
        return ReplyReading(by_length, "length", {"segments": segments})


def shipped_examples() -> list[tuple[str, str]]:
    """The shipped reply examples (:data:`REPLY_EXAMPLES`) and, as ``new_request``, the
    classify step's shipped examples the team wrote (the shop's requests; rows of public
    corpora, which name a ``source``, left out)."""
    out = [(d["label"], d["message"]) for d in _jsonl(REPLY_EXAMPLES)]
    out += [("new_request", d["message"]) for d in _jsonl(DEFAULT_EXAMPLES)
            if not d.get("source")]  # fmt: skip
    return out


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]  # fmt: skip


_DEFAULT: ReplyReader | None = None


def default_reader() -> ReplyReader:
    """The process's reader over the shipped examples (made on first use)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = ReplyReader()
    return _DEFAULT
