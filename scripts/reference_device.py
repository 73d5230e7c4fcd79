"""The device API's reference page (docs/device-reference.md) from include/mcast/device.h, for
scripts/gen-reference: its public names (no `__`) grouped as the header groups them under its
doc comments and section rules, each with its declaration and documentation; and the helpers
both pages use (`doc_text`, a doc comment's text; `cell`, a Markdown table cell).
"""
import re


def doc_text(lines):
    """The text of a /** ... */ comment's lines, without the comment marks."""
    out = []
    for line in lines:
        line = line.strip()
        line = re.sub(r"^/\*\*?\s?", "", line)
        line = re.sub(r"\s*\*/$", "", line)
        line = re.sub(r"^\*\s?", "", line)
        out.append(line)
    while out and not out[0]:
        out.pop(0)
    while out and not out[-1]:
        out.pop()
    text = "\n".join(out)
    return text.replace("# Safety\n", "**Safety.** ")


def cell(text):
    return " ".join(text.split()).replace("|", "\\|")


class Group:
    """Public items of mcast/device.h under one comment (or none), in the header's order."""

    def __init__(self, doc, plain=False):
        self.doc = doc
        self.plain = plain  # a /* comment: documents constants and types, not functions
        self.items = []  # (kind, name, decl, members); members: (name, type, comment) of a struct


def public(name):
    return name.startswith(("mcast_dev_", "MCAST_DEV_")) and "__" not in name


def split_args(text):
    """The top-level comma-separated arguments of `text` (without the outer parentheses)."""
    args, depth, cur = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            args.append(cur.strip())
            cur = ""
            continue
        depth += ch in "(["
        depth -= ch in ")]"
        cur += ch
    args.append(cur.strip())
    return args


def parse_device(text):
    """(intro, [(section title, [Group])]) of mcast/device.h."""
    lines = text.split("\n")
    i = 0
    # The file's opening comment is the page's introduction.
    while not lines[i].startswith("/*"):
        i += 1
    start = i
    while "*/" not in lines[i]:
        i += 1
    intro = doc_text(lines[start:i + 1])
    i += 1
    # Macros that define functions: name -> (parameters, the prototype line of the body).
    generators = {}
    for k, line in enumerate(lines):
        m = re.match(r"^#define (MCAST_DEV__[A-Z0-9_]+)\(([^)]*)\)", line)
        if m and k + 1 < len(lines) and "MCAST_DEV__FN" in lines[k + 1]:
            proto = lines[k + 1].rstrip("\\ ").strip()
            generators[m.group(1)] = ([a.strip() for a in m.group(2).split(",")], proto)
    sections = [("Constants and types", [])]
    group = None

    def add(kind, name, decl, members=None):
        nonlocal group
        if not public(name):
            return
        if group is None:
            group = Group("")
            sections[-1][1].append(group)
        group.items.append((kind, name, decl, members or []))

    while i < len(lines):
        line = lines[i]
        if not line.strip():
            group = None
            i += 1
        elif line.startswith("/*"):
            start = i
            while "*/" not in lines[i]:
                i += 1
            i += 1
            sep = re.match(r"^/\*\s*-{4,}\s*(.*?)\s*\*/$", line)
            if sep:
                title = sep.group(1)
                sections.append((title[0].upper() + title[1:], []))
                group = None
            else:
                doc = "\n".join(part.strip() for part in doc_text(lines[start:i]).split("\n"))
                group = Group(doc, plain=not line.startswith("/**"))
                sections[-1][1].append(group)
        elif line.startswith("#define"):
            m = re.match(r"^#define ([A-Za-z_0-9]+)(\(([^)]*)\))?\s*(.*)$", line)
            while lines[i].rstrip().endswith("\\"):
                i += 1
            i += 1
            if m.group(2) is None and m.group(1) != "MCAST_DEVICE_H":
                add("const", m.group(1), m.group(4).strip())
        elif line.startswith("#"):
            i += 1
        elif line.startswith("typedef enum"):
            members, i = [], i + 1
            while not lines[i].startswith("}"):
                m = re.match(r"^\s*([A-Z0-9_]+)\s*=\s*([^,]+),?", lines[i])
                if m:
                    members.append((m.group(1), m.group(2).strip(), ""))
                i += 1
            name = re.match(r"^}\s*([A-Za-z_0-9]+);", lines[i]).group(1)
            i += 1
            add("enum", name, f"typedef enum {{ ... }} {name};", members)
        elif line.startswith("typedef struct"):
            name = re.findall(r"[A-Za-z_0-9]+", line.split("{")[0])[-1]
            members, i = [], i + 1
            while not lines[i].startswith("}"):
                m = re.match(r"^\s*(.*?)\s*;\s*(?:/\*\s*(.*?)\s*\*/)?\s*$", lines[i])
                if m and m.group(1):
                    decl, comment = m.group(1), m.group(2) or ""
                    for part in decl.split(",")[1:]:
                        members.append((part.strip(), decl.split(",")[0].rsplit(" ", 1)[0], comment))
                    first = decl.split(",")[0]
                    fm = re.match(r"^(.*?)([A-Za-z_][A-Za-z0-9_]*)(\[[^\]]*\])?$", first)
                    members.insert(len(members) - (len(decl.split(",")) - 1),
                                   (fm.group(2), (fm.group(1) + (fm.group(3) or "")).strip(), comment))
                i += 1
            i += 1
            add("struct", name, f"typedef struct {{ ... }} {name};", members)
        elif line.startswith(("MCAST_DEV__FN", "MCAST_DEV__NOINLINE")):
            sig = []
            while True:
                sig.append(lines[i].strip())
                if "{" in lines[i]:
                    break
                i += 1
            one_line = lines[i].rstrip().endswith("}")
            i += 1
            if not one_line:
                while lines[i] != "}":
                    i += 1
                i += 1
            decl = " ".join(sig).split("{")[0].strip()
            decl = re.sub(r"^MCAST_DEV__(FN|NOINLINE)\s+", "", re.sub(r"\s+", " ", decl))
            name = re.search(r"([A-Za-z_0-9]+)\(", decl).group(1)
            add("function", name, decl + ";")
        elif re.match(r"^MCAST_DEV__[A-Z0-9_]+\(", line):
            call = line.strip()
            while call.count("(") > call.count(")"):
                i += 1
                call += " " + lines[i].strip()
            i += 1
            macro = call.split("(", 1)[0]
            args = split_args(call[len(macro) + 1:call.rindex(")")])
            if macro in generators:
                params, proto = generators[macro]
                decl = proto.split("{")[0].strip()
                for p, a in zip(params, args):
                    decl = re.sub(rf"\b{re.escape(p)}\b", a, decl)
                decl = re.sub(r"^MCAST_DEV__(FN|NOINLINE)\s+", "", decl)
                add("function", args[0], decl + ";")
        else:
            i += 1
    return intro, [(t, [g for g in gs if g.items]) for t, gs in sections if any(g.items for g in gs)]


def render_device(intro, sections):
    out = [
        "# mcast device API reference (`mcast/device.h`)",
        "",
        "Generated from [`include/mcast/device.h`](../include/mcast/device.h) by `scripts/gen-reference`;",
        "do not edit (the test command fails when it is stale). Every public name of the header (those",
        "without `__`), grouped as the header groups them; the guide is [device-api.md](device-api.md),",
        "the host functions that make the handles are in [reference.md](reference.md#11-device-api-handles).",
        "",
        "## About the header",
        "",
        "The header's own introduction:",
        "",
        "```text",
        intro,
        "```",
        "",
        "## Contents",
        "",
    ]
    for k, (title, _) in enumerate(sections, 1):
        anchor = re.sub(r"[^a-z0-9 -]", "", title.lower()).replace(" ", "-")
        out.append(f"{k}. [{title}](#{k}-{anchor})")
    for k, (title, groups) in enumerate(sections, 1):
        out += ["", f"## {k}. {title}"]
        for g in groups:
            names = [name for _, name, _, _ in g.items]
            head = ", ".join(f"`{n}`" for n in names) if len(names) <= 3 else f"`{names[0]}` and {len(names) - 1} more"
            out += ["", f"### {head}", ""]
            consts = [(name, decl) for kind, name, decl, _ in g.items if kind == "const"]
            others = [it for it in g.items if it[0] != "const"]
            if others:
                out += ["```c"] + [decl for _, _, decl, _ in others] + ["```", ""]
            if g.doc and not (g.plain and any(kind == "function" for kind, _, _, _ in g.items)):
                out += [g.doc, ""]
            if consts:
                out += ["| name | value |", "|---|---|"] + [f"| `{n}` | `{cell(v)}` |" for n, v in consts] + [""]
            for kind, name, _, members in others:
                if kind == "enum":
                    out += [f"`{name}`:", "", "| value | |", "|---|---|"]
                    out += [f"| `{m}` | {v} |" for m, v, _ in members] + [""]
                elif kind == "struct":
                    out += [f"`{name}`:", "", "| field | type | offset and meaning |", "|---|---|---|"]
                    out += [f"| `{m}` | `{t}` | {cell(c)} |" for m, t, c in members] + [""]
            while out[-1] == "":
                out.pop()
    return "\n".join(out) + "\n"
