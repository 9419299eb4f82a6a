"""Generate the bundled ChnSentiCorp-format sentiment sample (train/dev/test .tsv) and the tiny char vocab.

The sentences are written for this project: templates x short Chinese phrases about hotels, products
and books, with a fixed seed so the output is reproducible. Files follow PaddleNLP's ChnSentiCorp TSV
layout (tab separated, one header line):

    train.tsv  label<TAB>text_a
    dev.tsv    qid<TAB>label<TAB>text_a
    test.tsv   qid<TAB>text_a            (no labels, like the real test split)
    test_labels.tsv qid<TAB>label        (answers, kept apart so test.tsv stays in the real format)

Why it is learnable but not trivial: the label is carried by sentiment words, but a neutral prefix of
varying length moves them around, and ~30% of lines carry a "mild complaint" clause (虽然价格有点贵...)
that appears in both classes, so no single character position or single character decides the label.

Run:  python llm_examples/ernie/data/make_sample.py   (rewrites the .tsv files, ../tiny_ernie/vocab.txt
      and vocab_size in ../tiny_ernie/config.json)
"""
import json
import random
import string
from pathlib import Path

SEED = 20240601
N_TRAIN, N_DEV, N_TEST = 600, 150, 150

SUBJECTS = {
    "hotel": ["酒店", "房间", "前台", "服务", "早餐", "床", "卫生间", "环境", "服务员"],
    "product": ["手机", "电脑", "屏幕", "电池", "键盘", "耳机", "做工", "包装", "物流"],
    "book": ["这本书", "内容", "故事", "作者的文笔", "印刷", "纸张", "翻译", "插图"],
}
POSITIVE = ["非常好", "很干净", "很舒服", "特别满意", "值得推荐", "性价比很高", "物超所值", "很热情",
            "很方便", "超出预期", "真不错", "很精彩", "让人喜欢", "很实用", "很流畅", "质量上乘",
            "挺好的", "相当棒", "没得说", "让人惊喜"]
NEGATIVE = ["太差了", "很脏", "很吵", "非常失望", "不推荐", "性价比很低", "不值这个价", "很冷漠",
            "很不方便", "远低于预期", "真糟糕", "很无聊", "让人讨厌", "没什么用", "很卡", "质量低劣",
            "不太好", "相当烂", "没法说", "让人生气"]
# Neutral openers of different lengths: they shift where the sentiment words start.
PREFIXES = ["", "", "这次", "总的来说，", "第一次住，", "朋友推荐的，", "出差的时候，", "买来送人，",
            "用了一个月，", "看完以后觉得", "说实话", "老实讲，", "双十一买的，", "周末去的，"]
# Mild complaints/remarks shared by both classes (the label is decided by the other clause).
MILD = ["价格有点贵", "位置有点偏", "等了好几天", "包装很普通", "停车不太方便", "颜色和图片略有差别"]
POS_ENDINGS = ["", "", "。", "！", "，下次还会再来。", "，五星好评。", "，推荐大家购买。", "，很值得一看。"]
NEG_ENDINGS = ["", "", "。", "！", "，再也不来了。", "，给个差评。", "，大家别买了。", "，浪费时间。"]


def make_sentence(rng: random.Random, label: int) -> str:
    """One review: [prefix] subject phrase [, subject2 phrase2] [ending], optionally with a mild clause."""
    domain = rng.choice(sorted(SUBJECTS))
    subj = rng.sample(SUBJECTS[domain], 2)
    words = POSITIVE if label == 1 else NEGATIVE
    p1, p2 = rng.sample(words, 2)
    ending = rng.choice(POS_ENDINGS if label == 1 else NEG_ENDINGS)
    core = f"{subj[0]}{p1}"
    if rng.random() < 0.5:
        core += f"，{subj[1]}{p2}"
    r = rng.random()
    if r < 0.15:  # concession: the mild remark comes first, the real opinion after 但是
        return f"{rng.choice(PREFIXES)}虽然{rng.choice(MILD)}，但是{core}{ending}"
    if r < 0.30:  # the mild remark added on the same side as the opinion
        return f"{rng.choice(PREFIXES)}{core}，就是{rng.choice(MILD)}{ending}"
    return f"{rng.choice(PREFIXES)}{core}{ending}"


def make_rows(rng: random.Random, n: int, seen: set) -> list:
    """n unique (label, text) rows, balanced, never repeating a sentence in ``seen``."""
    rows = []
    while len(rows) < n:
        label = len(rows) % 2
        text = make_sentence(rng, label)
        if text not in seen:
            seen.add(text)
            rows.append((label, text))
    rng.shuffle(rows)
    return rows


def build_vocab(texts) -> list:
    """Char-level vocab: specials first (ERNIE order), ascii basics, then every char of the sample.

    The "##x" continuation pieces let WordPiece spell any lower-case ascii word letter by letter instead
    of mapping the whole word to [UNK] (ErnieTokenizer lower-cases before WordPiece).
    """
    specials = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]
    alnum = string.ascii_lowercase + string.digits
    ascii_basics = list(alnum + string.punctuation) + [f"##{c}" for c in alnum]
    chars = sorted({c for t in texts for c in t if not c.isspace()} - set(ascii_basics))
    return specials + ascii_basics + chars


def main(out_dir: Path = Path(__file__).parent, vocab_path: Path = None):
    rng = random.Random(SEED)
    seen = set()
    train, dev, test = (make_rows(rng, n, seen) for n in (N_TRAIN, N_DEV, N_TEST))
    with open(out_dir / "train.tsv", "w", encoding="utf-8") as f:
        f.write("label\ttext_a\n" + "".join(f"{y}\t{t}\n" for y, t in train))
    with open(out_dir / "dev.tsv", "w", encoding="utf-8") as f:
        f.write("qid\tlabel\ttext_a\n" + "".join(f"{i}\t{y}\t{t}\n" for i, (y, t) in enumerate(dev)))
    with open(out_dir / "test.tsv", "w", encoding="utf-8") as f:
        f.write("qid\ttext_a\n" + "".join(f"{i}\t{t}\n" for i, (_, t) in enumerate(test)))
    with open(out_dir / "test_labels.tsv", "w", encoding="utf-8") as f:
        f.write("qid\tlabel\n" + "".join(f"{i}\t{y}\n" for i, (y, _) in enumerate(test)))
    vocab_path = vocab_path or out_dir.parent / "tiny_ernie" / "vocab.txt"
    vocab = build_vocab(t for _, t in train + dev + test)
    vocab_path.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    config_path = vocab_path.parent / "config.json"
    if config_path.exists():  # keep the tiny model's embedding table the size of the vocab
        config = json.loads(config_path.read_text(encoding="utf-8"))
        config["vocab_size"] = len(vocab)
        config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {len(train)}/{len(dev)}/{len(test)} rows to {out_dir}, {len(vocab)} tokens to {vocab_path}")


if __name__ == "__main__":
    main()
