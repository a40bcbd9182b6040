#!/usr/bin/python3
"""Checks that every relative link of README.md and docs/*.md resolves: the file exists and,
for a .md target, the #anchor is one of its headings (GitHub slug rules).

    /usr/bin/python3 tests/check_doc_links.py REPO     # exits 1 on a broken link (ctest doc-links)
"""
import re, os, sys
root = sys.argv[1]
files = [os.path.join(root, 'README.md')] + sorted(os.path.join(root, 'docs', f) for f in os.listdir(os.path.join(root, 'docs')) if f.endswith('.md'))
def slug(h):
    h = re.sub(r'`', '', h)
    h = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', h)
    h = h.strip().lower()
    h = re.sub(r'[^\w\- ]', '', h)
    return h.replace(' ', '-')
def anchors(path):
    out, seen, fence = set(), {}, False
    for line in open(path):
        if line.startswith('```'): fence = not fence; continue
        if fence: continue
        m = re.match(r'^(#{1,6}) (.*)', line)
        if m:
            s = slug(m.group(2)); n = seen.get(s, 0); seen[s] = n + 1
            out.add(s if n == 0 else f'{s}-{n}')
    return out
bad = 0
for f in files:
    text = open(f).read()
    text_nofence = re.sub(r'```.*?```', '', text, flags=re.S)
    text_nofence = re.sub(r'`[^`\n]*`', '', text_nofence)
    for m in re.finditer(r'\]\(([^)\s]+)\)', text_nofence):
        t = m.group(1)
        if re.match(r'https?:', t): continue
        path, _, anc = t.partition('#')
        tgt = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
        if not os.path.exists(tgt):
            print(f'{f}: missing file {t}'); bad += 1; continue
        if anc and tgt.endswith('.md') and anc not in anchors(tgt):
            print(f'{f}: missing anchor {t}'); bad += 1
print(f'{bad} broken link(s)')
sys.exit(1 if bad else 0)
