#!/usr/bin/env python3
"""Builds the demo model's training and held-out data from the man pages installed on this machine.

Plain python3, no third-party modules, deterministic for a given set of installed pages and --seed.
Writes into --out (default tools/train-demo/data, git-ignored):
  train_text.txt.gz   man-page text for language modelling (pages separated by blank lines + <|endoftext|>)
  train_chat.jsonl.gz one harmony conversation per line: {"system", "user", "analysis", "final"}
  heldout_text.txt    text of man pages never used in training (perplexity)
  heldout_questions.json  questions about known commands, in phrasings never used in training,
                      each with keywords drawn from the command's man page
  commands.json       every command the conversations cover, with its NAME description
"""
import argparse
import gzip
import json
import os
import random
import re
import subprocess
import sys

MAN_DIR = "/usr/share/man/man1"

# The packages whose commands people ask about most; they get many more conversations than the rest,
# and the held-out questions are drawn from them.
CORE_PACKAGES = [
    "coreutils", "grep", "sed", "findutils", "tar", "gzip", "util-linux", "procps", "diffutils", "mawk",
    "less", "openssh-client", "curl", "wget", "make", "file", "psmisc", "bzip2", "xz-utils", "zip", "unzip",
    "bash", "man-db", "sqlite3", "jq", "git", "rsync", "patch", "time", "hostname", "iputils-ping", "cpio",
    "binutils", "gdb", "cmake", "ccache", "groff-base", "bsdextrautils", "debianutils", "passwd", "login",
    "dpkg", "apt", "gnupg", "openssl", "zstd", "lz4", "pkg-config", "strace", "ltrace", "valgrind",
    "python3", "perl", "vim", "nano", "emacs", "tmux", "screen", "htop", "lsof", "ncurses-bin",
]

TRAIN_TEMPLATES = [
    "What does `{c}` do?", "What does {c} do?", "what does {c} do", "What is {c}?", "What is `{c}`?",
    "what is {c}", "What is the {c} command?", "What is {c} used for?", "What's {c} for?",
    "Explain {c}.", "Explain the {c} command.", "Explain what `{c}` does.", "Describe {c}.",
    "Describe the {c} command.", "Tell me about {c}.", "Tell me what {c} does.", "{c}?", "`{c}`?",
    "What does the {c} command do?", "What does the `{c}` program do?", "What is the purpose of {c}?",
    "Can you tell me what {c} does?", "I found {c} on my system. What is it?", "Give me a one-line summary of {c}.",
    "Summarize the {c} command.", "What is {c} in Linux?", "Define {c}.", "In a shell, what does {c} do?",
    "What would I use {c} for?", "How would you describe {c}?", "Quick question: what does {c} do?",
    "what's {c}", "{c} - what is it?", "Please explain {c} briefly.", "What kind of program is {c}?",
    "What is the job of the {c} utility?",
]

# Never used in training: the held-out questions are asked only in these phrasings.
HELDOUT_TEMPLATES = [
    "Could you explain the purpose of the {c} utility to me?",
    "I keep seeing {c} in shell scripts. What is it for?",
    "My colleague mentioned {c}; what job does it perform?",
    "In plain words, what is {c} good for?",
    "Briefly, what task does the {c} tool handle?",
    "Someone told me to run {c}. What will it do?",
]

ANALYSIS_TEMPLATES = [
    "The user asks about {c}. Its manual page says: {d}.",
    "The user wants to know what {c} does. The man page describes it as: {d}.",
    "This is about the {c} command. Manual: {d}.",
]

EFFORTS = ["low", "medium", "high"]

FAMOUS = set("""grep sed tar gzip ls cp mv rm mkdir rmdir chmod chown find sort uniq wc head tail cat diff less curl
wget make ssh ps kill df du date echo tr cut paste cmp touch ln xargs tee whereis chsh zip unzip bzip2 xz file
hostname nohup sleep pwd env basename dirname top free uptime who whoami split join md5sum sha256sum""".split())


def system_text(effort):
    # Exactly what anvil's harmony renderer writes for a request without instructions or tools.
    return ("You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\n\n"
            f"Reasoning: {effort}\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.")


STOPWORDS = set("""a an the and or of to in on for from with by as at is are be it its this that these those
into over under via using use used your you their them than then which who what when where how can may
all any each other some such not no file files command commands program programs utility tool tools
based given one two more most also only like""".split())

NAMED_ESCAPES = {
    "em": "-", "en": "-", "hy": "-", "mi": "-", "lq": '"', "rq": '"', "oq": "'", "cq": "'", "aq": "'",
    "dq": '"', "bu": "*", "co": "(c)", "rg": "(R)", "tm": "(TM)", ">=": ">=", "<=": "<=", "->": "->",
    "<-": "<-", "ti": "~", "ha": "^", "rs": "\\", "sl": "/", "ga": "`", "aa": "'", "pl": "+", "eq": "=",
    "mu": "x", "de": " degrees", "Fo": "<<", "Fc": ">>", "fo": "<", "fc": ">", "lB": "[", "rB": "]",
    "lC": "{", "rC": "}", "ba": "|", "or": "|", "at": "@", "sh": "#", "dg": "+", "ua": "^", "da": "v",
}


def unescape(text):
    text = re.sub(r'\\".*$', "", text)
    text = re.sub(r"\\f(\[[^\]]*\]|\(..|.)", "", text)
    text = re.sub(r"\\s[-+]?(\d|\(\d\d|\[\d+\])", "", text)
    text = re.sub(r"\\\*(\[[^\]]*\]|\(..|.)", "", text)
    text = re.sub(r"\\n[-+]?(\[[^\]]*\]|\(..|.)", "", text)
    text = re.sub(r"\\[hvwkloLNDbxXzYZ]'[^']*'", "", text)
    text = re.sub(r"\\\((..)", lambda m: NAMED_ESCAPES.get(m.group(1), ""), text)
    text = re.sub(r"\\\[([^\]]*)\]", lambda m: NAMED_ESCAPES.get(m.group(1), ""), text)
    text = text.replace("\\-", "-").replace("\\e", "\\").replace("\\ ", " ").replace("\\~", " ")
    text = text.replace("\\0", " ").replace("\\t", "\t")
    text = re.sub(r"\\[&%|^c:}{!)/,dum]", "", text)
    text = text.replace("\\\\", "\\").replace("\\'", "'").replace("\\`", "`").replace("\\.", ".")
    text = re.sub(r"\\(.)", r"\1", text)
    return text


def macro_args(rest):
    args, current, quoted, i = [], "", False, 0
    while i < len(rest):
        ch = rest[i]
        if ch == '"':
            if quoted and i + 1 < len(rest) and rest[i + 1] == '"':
                current += '"'
                i += 1
            else:
                quoted = not quoted
        elif ch in " \t" and not quoted:
            if current:
                args.append(current)
            current = ""
        else:
            current += ch
        i += 1
    if current:
        args.append(current)
    return args


FONT_MACROS = {"B", "I", "SM", "SB"}
ALT_MACROS = {"BR", "RB", "BI", "IB", "IR", "RI"}
BREAK_MACROS = {"PP", "LP", "P", "TP", "HP", "sp", "br", "RS", "RE", "nf", "fi", "SS", "SH", "Sh", "Ss", "Pp", "Bl",
                "El", "Bd", "Ed", "TQ", "EX", "EE", "UE", "ME"}
MDOC_DROP = {"Fl": "-", "Ar": "", "Nm": "", "Op": "", "Ql": "", "Dq": "", "Sq": "", "Pa": "", "Cm": "", "Xr": "",
             "Em": "", "Sy": "", "Li": "", "Ev": "", "Va": "", "Ic": "", "Ns": "", "Pq": "", "Ux": "UNIX", "Bx": "BSD"}


def roff_to_sections(source):
    """Crude man(7)/mdoc(7) -> {section: text}; good enough for language modelling and NAME lines."""
    sections, order, current, lines = {}, [], None, []
    mdoc_name = None
    skip_until_dots = False
    for raw in source.splitlines():
        if skip_until_dots:
            if raw.startswith(".."):
                skip_until_dots = False
            continue
        if raw.startswith(('.\\"', "'\\\"", '\\"')):
            continue
        if raw.startswith((".", "'")):
            match = re.match(r"[.'](\S+)\s*(.*)$", raw)
            if not match:
                continue
            name, rest = match.group(1), match.group(2)
            if name in ("de", "de1", "ig", "am"):
                skip_until_dots = True
                continue
            if name in ("SH", "Sh"):
                if current is not None:
                    sections[current] = "\n".join(lines)
                current = unescape(" ".join(macro_args(rest))).strip().upper()
                order.append(current)
                lines = []
                continue
            if name in BREAK_MACROS:
                if name in ("SS", "Ss"):
                    lines.append("")
                    lines.append(unescape(" ".join(macro_args(rest))))
                elif name not in ("br", "nf", "fi", "RE"):
                    lines.append("")
                continue
            if name in ("IP", "It"):
                lines.append("")
                args = macro_args(rest)
                if args:
                    lines.append(unescape(args[0] if name == "IP" else " ".join(a for a in args if a not in MDOC_DROP)))
                continue
            if name in FONT_MACROS:
                lines.append(unescape(" ".join(macro_args(rest))))
                continue
            if name in ALT_MACROS:
                lines.append(unescape("".join(macro_args(rest))))
                continue
            if name == "UR" or name == "MT":
                lines.append(unescape(rest))
                continue
            if name == "Nm" and rest:
                if mdoc_name is None:
                    mdoc_name = unescape(macro_args(rest)[0])
                lines.append(unescape(rest if current != "NAME" else macro_args(rest)[0] + ","))
                continue
            if name == "Nd":
                lines.append("\\- " + unescape(rest))
                continue
            if re.fullmatch(r"[A-Z][a-z]", name):
                words = [MDOC_DROP.get(a, a) for a in macro_args(rest)]
                prefix = MDOC_DROP.get(name, "")
                text = " ".join(w for w in words if w)
                if name == "Fl":
                    text = "-" + text
                lines.append(unescape((prefix + " " + text).strip() if name != "Fl" else text))
                continue
            continue  # requests: .if .ie .el .nr .ds .ft .in .ad .na .hy ...
        lines.append(unescape(raw))
    if current is not None:
        sections[current] = "\n".join(lines)
    return sections, order


def tidy(text):
    out, blank = [], False
    for line in text.splitlines():
        line = re.sub(r"[ \t]+", " ", line).strip()
        if not line:
            blank = bool(out)
            continue
        if blank:
            out.append("")
            blank = False
            out.append(line)
        elif out and out[-1] and not out[-1].isupper():
            # roff breaks a paragraph at every font change; rejoin it as the pager would show it.
            out[-1] += " " + line
        else:
            out.append(line)
    return "\n".join(out)


def parse_name(name_section):
    text = " ".join(tidy(name_section).split())
    text = text.replace("\\-", "-")
    match = re.match(r"^(.+?)\s+[-\u2013\u2014]+\s+(.+)$", text)
    if not match:
        return None
    names = [n.strip(" ,") for n in match.group(1).split(",") if n.strip(" ,")]
    desc = match.group(2).strip().rstrip(".")
    if not names or not desc or len(desc) > 140 or len(desc) < 6:
        return None
    return names, desc


def core_pages():
    pages = set()
    for package in CORE_PACKAGES:
        try:
            listing = subprocess.run(["dpkg", "-L", package], capture_output=True, text=True, check=False).stdout
        except OSError:
            continue
        for path in listing.splitlines():
            if path.startswith(MAN_DIR + "/"):
                pages.add(os.path.basename(path))
    return pages


def keywords(desc, command):
    words = re.findall(r"[A-Za-z][A-Za-z0-9+-]{2,}", desc.lower())
    seen = []
    for word in words:
        if word in STOPWORDS or word == command.lower() or word in seen:
            continue
        seen.append(word)
    return seen


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "data"))
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--max-page-bytes", type=int, default=60000, help="cap on the text kept per page")
    parser.add_argument("--heldout-chars", type=int, default=24000)
    parser.add_argument("--heldout-questions", type=int, default=24)
    parser.add_argument("--gcloud-pages", type=int, default=1000)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    os.makedirs(args.out, exist_ok=True)

    core = core_pages()
    files = sorted(f for f in os.listdir(MAN_DIR) if f.endswith(".gz"))
    # The Google Cloud SDK alone installs ~16,000 near-identical pages; a sample keeps it from
    # swamping the rest.
    gcloud = [f for f in files if f.startswith("gcloud")]
    keep = set(random.Random(args.seed).sample(gcloud, min(len(gcloud), args.gcloud_pages)))
    files = [f for f in files if not f.startswith("gcloud") or f in keep]
    pages = []  # (file, command, names, desc, text)
    for file in files:
        path = os.path.join(MAN_DIR, file)
        if os.path.islink(path) or os.path.getsize(path) > 400000:
            continue
        try:
            source = gzip.open(path, "rb").read().decode("utf-8", "replace")
        except (OSError, EOFError):
            continue
        if source.lstrip().startswith(".so "):
            continue
        sections, order = roff_to_sections(source)
        name = parse_name(sections.get("NAME", "")) if "NAME" in sections else None
        command = file[: -len(".1.gz")] if file.endswith(".1.gz") else file.rsplit(".", 2)[0]
        parts = []
        for title in order:
            body = tidy(sections.get(title, ""))
            if body:
                parts.append(title + "\n" + body)
        text = "\n\n".join(parts)[: args.max_page_bytes]
        if len(text) < 80:
            continue
        pages.append((file, command, name, text))
    print(f"parsed {len(pages)} pages from {len(files)} files; core pages installed: {len(core)}", file=sys.stderr)

    # Commands asked about: a NAME line whose names include the page's own command.
    commands = {}
    for file, command, name, text in pages:
        if not name:
            continue
        names, desc = name
        if command not in names or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", command):
            continue
        if command not in commands:
            commands[command] = {"desc": desc, "core": file in core, "file": file}

    core_commands = sorted(c for c, v in commands.items() if v["core"])
    rng.shuffle(core_commands)
    # Questions people actually ask first, then the rest of the core set.
    core_commands.sort(key=lambda c: 0 if c in FAMOUS else 1)
    # Held-out questions: well-known commands whose descriptions give at least two keywords.
    heldout = []
    for command in core_commands:
        kws = keywords(commands[command]["desc"], command)
        if len(kws) >= 2 and len(command) >= 2:
            template = HELDOUT_TEMPLATES[len(heldout) % len(HELDOUT_TEMPLATES)]
            heldout.append({"command": command, "question": template.format(c=command), "keywords": kws,
                            "description": commands[command]["desc"]})
        if len(heldout) == args.heldout_questions:
            break

    # Held-out text: whole pages that are neither trained on nor asked about.
    non_core = [p for p in pages if (p[1] not in commands or not commands[p[1]]["core"]) and not p[1].startswith("gcloud")]
    rng.shuffle(non_core)
    heldout_files, heldout_text = set(), []
    for file, command, name, text in non_core:
        if sum(len(t) for t in heldout_text) >= args.heldout_chars:
            break
        if len(text) < 1500:
            continue
        heldout_files.add(file)
        heldout_text.append(text[:6000])
    with open(os.path.join(args.out, "heldout_text.txt"), "w") as out:
        out.write("\n\n".join(heldout_text) + "\n")

    train_pages = [p for p in pages if p[0] not in heldout_files]
    rng.shuffle(train_pages)
    with gzip.open(os.path.join(args.out, "train_text.txt.gz"), "wt") as out:
        for file, command, name, text in train_pages:
            out.write(text + "\n<|endoftext|>\n")

    conversations = []
    for command, info in sorted(commands.items()):
        if info["file"] in heldout_files:
            continue
        desc = info["desc"]
        repeats = 36 if info["core"] else 6
        templates = TRAIN_TEMPLATES[:]
        rng.shuffle(templates)
        for i in range(repeats):
            template = templates[i % len(templates)]
            analysis = ANALYSIS_TEMPLATES[rng.randrange(len(ANALYSIS_TEMPLATES))].format(c=command, d=desc)
            final = f"`{command}`: {desc}."
            conversations.append({"system": system_text(EFFORTS[rng.randrange(3)] if i % 3 else "medium"),
                                  "user": template.format(c=command), "analysis": analysis, "final": final})
    rng.shuffle(conversations)
    with gzip.open(os.path.join(args.out, "train_chat.jsonl.gz"), "wt") as out:
        for conversation in conversations:
            out.write(json.dumps(conversation) + "\n")
    with open(os.path.join(args.out, "heldout_questions.json"), "w") as out:
        json.dump({"system": system_text("medium"), "questions": heldout}, out, indent=1)
    with open(os.path.join(args.out, "commands.json"), "w") as out:
        json.dump(commands, out, indent=0, sort_keys=True)
    print(f"{len(commands)} commands ({len(core_commands)} core), {len(conversations)} conversations, "
          f"{len(train_pages)} training pages ({sum(len(p[3]) for p in train_pages) / 1e6:.1f} MB), "
          f"{len(heldout_files)} held-out pages ({sum(len(t) for t in heldout_text)} chars), "
          f"{len(heldout)} held-out questions", file=sys.stderr)


if __name__ == "__main__":
    main()
