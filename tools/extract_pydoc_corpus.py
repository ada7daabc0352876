#!/usr/bin/env python3
"""extract_pydoc_corpus.py — plain English text from Python's HTML documentation, for the bundled model.

Source: the Debian package `python3.11-doc` (what `python3-doc` depends on), licence PSF-2.0 (the
Python Software Foundation License; see /usr/share/doc/python3.11/html/license.html in the package).
Get it without installing:  apt-get download python3.11-doc && dpkg -x python3.11-doc_*.deb X
then:                       python3 tools/extract_pydoc_corpus.py X/usr/share/doc/python3.11/html OUTDIR

It reads the main body (`<div class="body" role="main">`) of every page except the generated indexes and
the changelog, drops the permalink marks, keeps code blocks (<pre>) verbatim, collapses whitespace inside
paragraphs, and writes OUTDIR/train.txt and OUTDIR/heldout.txt: documents (one per page, sorted by path)
separated by a line holding `<|endoftext|>`. Every 30th document goes to heldout.txt (about 3%).
"""
import html.parser
import re
import sys
from pathlib import Path

SKIP = re.compile(r"(^|/)(genindex.*|search|py-modindex|contents|copyright|download|bugs)\.html$|whatsnew/changelog\.html$")
BLOCK = {"p", "div", "section", "h1", "h2", "h3", "h4", "h5", "h6", "li", "dt", "dd", "tr", "table",
         "blockquote", "ul", "ol", "dl", "br", "caption", "figure"}
EOT = "<|endoftext|>"


class BodyText(html.parser.HTMLParser):
    """Collects text from the div with role="main"; paragraphs end at block tags, <pre> stays verbatim."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.depth = 0          # div nesting inside the main body (0 = outside)
        self.skip = 0           # inside a headerlink anchor / script / style
        self.pre = 0
        self.parts = []         # finished blocks
        self.cur = []

    def flush(self):
        t = "".join(self.cur)
        self.cur = []
        if self.pre:
            return
        t = re.sub(r"\s+", " ", t).strip()
        if t:
            self.parts.append(t)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if self.depth == 0:
            if tag == "div" and a.get("role") == "main":
                self.depth = 1
            return
        if tag == "div":
            self.depth += 1
        if tag in ("script", "style") or (tag == "a" and "headerlink" in (a.get("class") or "")):
            self.skip += 1
            return
        if tag == "pre":
            self.flush()
            self.pre += 1
            return
        if tag in BLOCK and not self.pre:
            self.flush()

    def handle_endtag(self, tag):
        if self.depth == 0:
            return
        if tag in ("script", "style") or (tag == "a" and self.skip):
            self.skip = max(0, self.skip - 1)
            return
        if tag == "pre" and self.pre:
            self.pre -= 1
            code = "".join(self.cur).rstrip()
            self.cur = []
            if code.strip():
                self.parts.append(code)
            return
        if tag in BLOCK and not self.pre:
            self.flush()
        if tag == "div":
            self.depth -= 1
            if self.depth == 0:
                self.flush()

    def handle_data(self, data):
        if self.depth and not self.skip:
            self.cur.append(data)


def page_text(path):
    p = BodyText()
    p.feed(path.read_text(encoding="utf-8", errors="replace"))
    p.flush()
    text = "\n\n".join(p.parts)
    return text.replace(EOT, "")


def main():
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    pages = sorted(q for q in src.rglob("*.html")
                   if not SKIP.search(q.relative_to(src).as_posix()) and "_sources" not in q.parts)
    train, held = [], []
    for i, q in enumerate(pages):
        t = page_text(q)
        if len(t) < 200:
            continue
        (held if i % 30 == 15 else train).append(t)
    for name, docs in (("train.txt", train), ("heldout.txt", held)):
        (out / name).write_text(("\n" + EOT + "\n").join(docs) + "\n", encoding="utf-8")
        print(f"{name}: {len(docs)} documents, {sum(len(d) for d in docs)} characters")


if __name__ == "__main__":
    main()
