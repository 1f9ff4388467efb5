"""The history budget's token estimate against a real tokenizer, script by script.

Counts shop texts written in eleven scripts with llama-server's ``POST /tokenize`` (the
embedded Gemma 3 270M's own tokenizer, or ``--base-url`` for another llama-server) and
with chainrun's two estimates: the old four characters a token, and the script-aware
estimate of :func:`chainrun.conversations.tokens.estimate_tokens`. Reports per script
the characters per token measured and each estimate's error (estimate / real - 1).

Run: ``python benchmarks/token_estimate.py [--base-url http://127.0.0.1:8080/v1] [--json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from typing import Any

import _common as c
import httpx2

from chainrun.conversations.tokens import estimate_tokens, server_root

TEXTS: dict[str, list[str]] = {
    "english": [
        "Do you have a waterproof rain jacket in navy, size M, for under 100 euros?",
        "My order 1042 has not arrived yet; the tracking page says it left the depot on Monday.",
        "Can I swap the linen dress for a size up, or do I have to send it back first?",
    ],
    "german": [
        "Haben Sie eine wasserdichte Regenjacke in Marineblau, Größe M, unter 100 Euro?",
        "Meine Bestellung 1042 ist noch nicht angekommen; laut Sendungsverfolgung seit "
        "Montag unterwegs.",
    ],
    "french": [
        "Avez-vous une veste de pluie imperméable en bleu marine, taille M, à moins de 100 euros ?",
        "Puis-je échanger la robe en lin contre une taille au-dessus, ou dois-je la "
        "renvoyer d'abord ?",
    ],
    "japanese": [
        "100ユーロ以下で、ネイビーのMサイズの防水レインジャケットはありますか？",
        "注文番号1042がまだ届いていません。追跡ページでは月曜日に倉庫を出たとなっています。",
        "リネンのワンピースをワンサイズ上に交換できますか？先に返品が必要ですか？",
    ],
    "chinese": [
        "你们有100欧元以下的海军蓝M码防水雨衣吗？",
        "我的订单1042还没到，物流页面显示周一已经离开仓库。",
        "亚麻连衣裙可以换大一码吗？还是需要先退货？",
    ],
    "korean": [
        "100유로 이하로 네이비 색상 M 사이즈 방수 레인 재킷이 있나요?",
        "주문 1042가 아직 도착하지 않았어요. 배송 조회에는 월요일에 창고를 떠났다고 나옵니다.",
    ],
    "russian": [
        "У вас есть непромокаемая куртка тёмно-синего цвета, размер M, дешевле 100 евро?",
        "Мой заказ 1042 ещё не пришёл; на странице отслеживания написано, что он уехал в "
        "понедельник.",
    ],
    "arabic": [
        "هل لديكم سترة مطر مقاومة للماء باللون الكحلي، مقاس M، بأقل من 100 يورو؟",
        "لم يصل طلبي رقم 1042 بعد؛ صفحة التتبع تقول إنه غادر المستودع يوم الاثنين.",
    ],
    "hindi": [
        "क्या आपके पास 100 यूरो से कम में नेवी रंग की M साइज़ की वाटरप्रूफ रेन जैकेट है?",
        "मेरा ऑर्डर 1042 अभी तक नहीं आया है; ट्रैकिंग पेज कहता है कि यह सोमवार को गोदाम से निकला।",
    ],
    "thai": [
        "มีเสื้อกันฝนกันน้ำสีกรมท่า ไซส์ M ราคาไม่เกิน 100 ยูโรไหมคะ",
        "คำสั่งซื้อ 1042 ของฉันยังไม่มาถึง หน้าติดตามบอกว่าออกจากคลังสินค้าเมื่อวันจันทร์",
    ],
    "emoji": [
        "Love it!!! 😍😍🔥 can I get it in 💙 blue? 🙏🙏",
        "🧥🌧️☔ size M pls 👍👍👍 thanks 😊🎉",
    ],
}


def old_estimate(text: str) -> int:
    return math.ceil(len(text) / 4)


async def measure(root: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with httpx2.AsyncClient(timeout=10) as client:
        for script, texts in TEXTS.items():
            real = old = new = chars = 0
            for t in texts:
                r = await client.post(root + "/tokenize", json={"content": t})
                real += len(r.json()["tokens"])
                old += old_estimate(t)
                new += estimate_tokens(t)
                chars += len(t)
            out[script] = {"texts": len(texts), "chars": chars, "real_tokens": real,
                           "chars_per_token": round(chars / real, 2),
                           "old_estimate": old, "old_error": round(old / real - 1, 3),
                           "new_estimate": new, "new_error": round(new / real - 1, 3)}
    return out


def summary(doc: dict[str, Any]) -> str:
    lines = [f"{'script':10s} {'chars/tok':>9s} {'real':>5s} {'old est':>8s} {'old err':>8s} "
             f"{'new est':>8s} {'new err':>8s}"]  # fmt: skip
    for s, v in doc["results"]["by_script"].items():
        lines.append(f"{s:10s} {v['chars_per_token']:9.2f} {v['real_tokens']:5d} "
                     f"{v['old_estimate']:8d} {v['old_error']:+8.1%} {v['new_estimate']:8d} "
                     f"{v['new_error']:+8.1%}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url",
                   help="a llama-server's OpenAI base URL (default: the embedded model)")
    c.add_common_options(p)
    args = p.parse_args(argv)
    doc = c.new_document("token_estimate", argv, {"base_url": args.base_url})
    if args.base_url:
        root = server_root(args.base_url)
        doc["parameters"]["tokenizer"] = args.base_url
        doc["results"]["by_script"] = asyncio.run(measure(root))
    else:
        from chainrun.runtime import local_model

        ours = local_model.status() is None  # stop only a server this run started
        server = local_model.up(quiet=True)
        try:
            doc["parameters"]["tokenizer"] = f"llama-server /tokenize, {server.model_path}"
            doc["results"]["by_script"] = asyncio.run(measure(f"http://127.0.0.1:{server.port}"))
        finally:
            if ours:
                local_model.stop(server)
    c.finish(doc, as_json=args.json, summary=summary, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
