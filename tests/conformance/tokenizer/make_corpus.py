#!/usr/bin/env python3
"""Writes corpus.jsonl: the varied text the tokenizer conformance tests run over (one JSON
string per line). Deterministic; re-run only to change the corpus, then regenerate the BPE
fixtures (gen_bpe_fixtures.py) with Hugging Face tokenizers."""
import json
import random

S = []
add = S.append
# Prose, contractions, casing.
add("The quick brown fox jumps over the lazy dog.")
add("Don't stop! I'M sure we'LL win, it's fine; they've gone and you'd know. She'S here.")
add("HELLO'S World, camelCaseString XMLHttpRequest iPhone McDonald's O'Neil")
add("'s 't 're 've 'm 'll 'd 'S 'T 'RE 'Ve 'mM 'LL 'D ’s ’re 'ſ 'x")
add("")
add(" ")
add("a")
add("   leading and trailing spaces   ")
add("multiple     spaces      between\t\ttabs\tand\t \t mixed")
add(" " * 1 + "x" + " " * 2 + "y" + " " * 7 + "z" + " " * 33 + "end" + " " * 64)
add("\t\t\tindented\n\t\t\t\tdeeper\n")
add("line one\r\nline two\r\n\r\nline four\rcarriage\n\nnewlines\n\n\n")
add("\n")
add("\r\n")
add(" \n \n  \n")
add("word\n   \n  next")
add("1234567890123456789012345678901234567890 and 3.14159265358979 and 1,000,000.00")
add("0 00 000 0000 00000 000000 12 123 1234 12345 123456 1234567")
add("Phone: +1 (555) 123-4567, ZIP 94107-1234, 2024-01-31T12:34:56Z, 10:30am")
add("٣٤٥ ١٢٣ Ⅻ ½ ¾ ² ³ ① ⑳ 𝟘𝟙𝟚 ０１２３")
# Code.
add("int main(int argc, char** argv) {\n    std::vector<int> v{1, 2, 3};\n    return v.size() > 2 ? 0 : 1;\n}\n")
add("def f(x):\n\tif x is None:\n\t\treturn {'a': [1, 2], \"b\": None}\n\treturn x ** 2  # square\n")
add('{"key": "value", "n": 42, "arr": [true, false, null], "nested": {"x": -1.5e10}}')
add("SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;")
add("https://example.com/path/to/page?query=1&x=y#frag  C:\\Windows\\System32\\drivers  a//b\n/c//\n")
add("<div class=\"x\">&nbsp;&lt;tag&gt;</div> <!-- comment --> $var @user #tag ~/.bashrc")
add("x += 1; y -= 2; z *= 3; a ||= b; c &&= d; e ??= f; g >>>= 1; => -> :: ... !== ===")
add("    // four-space indent\n        /* eight */\n\t// tab\n")
# Scripts.
add("Съешь же ещё этих мягких французских булок, да выпей чаю.")
add("Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.")
add("我能吞下玻璃而不伤身体。这是一个测试句子，包含标点符号！")
add("いろはにほへと ちりぬるを カタカナ ｶﾀｶﾅ 漢字とひらがな。")
add("다람쥐 헌 쳇바퀴에 타고파. 한국어 문장입니다.")
add("\u1100\u1161\u11a8 \u1112\u1161\u11ab decomposed jamo")
add("صِف خَلقَ خَودِ كَمِثلِ الشَمسِ إِذ بَزَغَت — العربية")
add("עברית: דג סקרן שט בים מאוכזב ולפתע מצא חברה")
add("हिन्दी: ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश करने वाले")
add("ไทย: เป็นมนุษย์สุดประเสริฐเลิศคุณค่า")
add("தமிழ்: யாமறிந்த மொழிகளிலே தமிழ்மொழி போல் இனிதாவது எங்கும் காணோம்")
add("Tiếng Việt: Tôi có thể ăn thủy tinh mà không hại gì.")
add("Tie\u0302\u0301ng Vie\u0323\u0302t decomposed")
add("Ǆemal ǅungla ǆ ʰʲʷ ℌℍ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝐀𝐁𝐂 𠀀𠀁 ꙮ")
# Combining marks, NFC-sensitive, compatibility.
add("e\u0301 a\u0308\u0301 o\u0328\u0304 A\u030a \u212b \u1e9b\u0323 q\u0307\u0323")
add("\u0301 leading combining, \u0300\u0301\u0302 stacked, Z\u0351\u0352\u0353\u0354a\u0355\u0356l\u0357g\u0358o")
add("ﬁ ﬂ ﬀ ＡＢＣ １２３ ｱｲｳ ㍿ ™ ℃ ㎏ Ⅳ ⁵ ₂ …")
add("Å Å Å é é ñ ñ ü ü ḱ ṩ ṩ")
# Emoji.
add("👨‍👩‍👧‍👦 family 🏳️‍🌈 flag 👍🏽 thumbs 🇺🇸🇯🇵 flags 1️⃣ keycap 🧑🏿‍🚀 astronaut")
add("😀😃😄😁😆😅🤣😂🙂🙃😉😊😇 ❤️ ✨ 🔥 💯")
add("\u200d lone zwj, a\u200db, \u200b zero width, \ufeff bom, \u2060 wj")
# Unicode whitespace and controls.
add("nbsp\u00a0here ideographic\u3000space line\u2028sep para\u2029sep nel\u0085x")
add("vt\x0bff\x0cfs\x1cgs\x1dus\x1f del\x7f nul\x00 soh\x01 end")
add("\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f")
add("private \ue000\uf8ff noncharacter \ufffe\uffff replacement \ufffd tag \U000e0001\U000e0041")
# Strings that look like special tokens / pieces.
add("<|start|>user<|message|>Hello<|end|><|start|>assistant<|channel|>final<|message|>Hi<|return|>")
add("<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>")
add("<|endoftext|> <|startoftext|> <|reserved_200000|> <|constrain|> <|call|>")
add("<think>\nreasoning here\n</think>\n\nanswer <tool_call>{}</tool_call> <|fim_prefix|>x<|fim_suffix|>")
add("<|<|start|>|> <|start <start|> <||> <|im_start <|im_start|<|im_start|>")
add("<s> </s> <unk> <pad> <0x41> <0xFF> ▁ ▁▁ ▁hello ⁇ <mask> <sep> <cls>")
add("Ġ Ċ ĠĠ âĢ¦ Ã© byte-level lookalikes")
# Punctuation runs and slashes (o200k [\r\n/]*).
add("!!! ??? ... --- *** ### ``` ~~~ ((( ))) [[ ]] {{ }} a/b/ c// /\n/\r\n// ' \" `")
add("end with slash/\nnext//\n\n/// x")
add("Mixed123Numbers456and789Letters a1b2c3 x86_64 utf-8 UTF8 v1.2.3-rc.4+build.5")
# Long text.
para = ("In the beginning the Universe was created. This has made a lot of people very "
        "angry and been widely regarded as a bad move. ")
add(para * 12)
add(("汉字" * 50) + (" 😀" * 20) + ("\t" * 10) + (" " * 100) + ("9" * 200))
add("\n".join("    line %d: value = %d;  // comment" % (i, i * i) for i in range(40)))
# Random mixes from an alphabet of interesting characters (deterministic).
alphabet = list("abcXYZ019 \t\n\r'’/\\.,!?-_<>|{}[]()\"") + [
    "é", "e\u0301", "ß", "ſ", "Ǆ", "ʰ", "ℌ", "Ⅻ", "½", "٣", "漢", "字", "か", "カ", "한", "\u1100",
    "\u1161", "ע", "ب", "\u0651", "ह", "\u093f", "ไ", "\u0e31", "😀", "👍", "\U0001f3fd", "\u200d",
    "\ufe0f", "\u00a0", "\u3000", "\u2028", "\u0085", "\x0b", "\x00", "\ufffd", "\ue000", "▁",
    "Ġ", "<|start|>", "<|im_start|>", "<think>", "’", "…", "—", "ﬁ", "Ａ", "①", "𝔘", "𠀀"]
rng = random.Random(1234)
for n in range(80):
    k = rng.randint(1, 60)
    add("".join(rng.choice(alphabet) for _ in range(k)))
for n in range(20):
    k = rng.randint(1, 12)
    add("".join(rng.choice([" ", "  ", "\t", "\n", "\r\n", "x", "1", "é", "'s", "/"]) for _ in range(k)))

with open("corpus.jsonl", "w", encoding="utf-8") as f:
    for s in S:
        f.write(json.dumps(s, ensure_ascii=True) + "\n")
print(len(S), "samples")
