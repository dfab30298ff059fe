#!/usr/bin/env python3
"""Checks that result workbooks keep every original sheet and cell of their inputs, as openpyxl reads them.

    compare_workbooks.py PAIRS.json

PAIRS.json lists {"name", "input", "result", "sheet", "header_row", "added": [header names], "overflow": [{"row",
"column", "text"}] (optional: answers the result holds in its batchgen_overflow sheet), "dates": [{"row", "date"}]
(optional: cells of the last added column that must be dates, not text, with that ISO date)}. For each pair, every sheet of the
input must be in the result, in the same order, and every cell of every input sheet must have the same value, data
type and number format in the result; merged ranges, data validations, frozen panes and the widths of the input's
columns must be the same too. On the input sheet, the header row must end with the added names. Prints one line
per pair and exits 1 when any differs. The internal/sheet office test runs it on the public workbooks, once on the
files themselves and once on the copies LibreOffice saved of them.
"""
import json
import sys
import warnings

import openpyxl

warnings.simplefilter("ignore")  # openpyxl warns about extensions it does not read (slicers, x14 validation)


def load(path):
    return openpyxl.load_workbook(path, data_only=False, rich_text=False)


def plain(v):
    """A value openpyxl returns as an object (an array formula) as its text, so that equal ones compare equal."""
    if hasattr(v, "ref") and hasattr(v, "text"):
        return ("array formula", v.ref, v.text)
    return v


def compare(pair):
    problems = []
    a, b = load(pair["input"]), load(pair["result"])
    overflow = pair.get("overflow") or []
    prompt = pair.get("prompt")
    want_sheets = a.sheetnames + (["batchgen_overflow"] if overflow else []) + (["prompt"] if prompt else [])
    if b.sheetnames != want_sheets:
        return [f"sheets {a.sheetnames} became {b.sheetnames}, want {want_sheets}"]
    if prompt and b["prompt"]["A1"].value != prompt:
        # The result carries the template it was made with, read again when it is sent back in.
        problems.append(f"prompt!A1 is {b['prompt']['A1'].value!r}, want {prompt!r}")
    for o in overflow:
        # An answer too long for a cell is whole in the overflow sheet, in parts.
        parts = [r for r in b["batchgen_overflow"].iter_rows(min_row=2, values_only=True) if r[0] == o["row"] and r[1] == o["column"]]
        text = "".join(r[3] for r in parts)
        if text != o["text"]:
            problems.append(f"overflow of row {o['row']} {o['column']}: {len(text)} characters, want {len(o['text'])}")
    sheet = b[pair["sheet"]]
    header = [c.value for c in sheet[pair["header_row"]]]
    while header and header[-1] is None:
        header.pop()
    added = pair["added"]
    if header[-len(added):] != added:
        return [f"{pair['sheet']} header row {pair['header_row']} is {header}, want it to end with {added}"]
    first_added = len(header) - len(added) + 1  # the input sheet's columns from here on are the result's
    for d in pair.get("dates") or []:
        cell = sheet.cell(row=d["row"], column=len(header))
        value = cell.value.date().isoformat() if hasattr(cell.value, "date") else cell.value
        if not cell.is_date or value != d["date"]:
            problems.append(f"{cell.coordinate}: {cell.value!r} ({cell.number_format}), want the date {d['date']}")
    for name in a.sheetnames:
        sa, sb = a[name], b[name]
        if not hasattr(sa, "iter_rows"):  # a chart sheet
            continue
        ours = first_added if name == pair["sheet"] else None
        # The cells the part holds, not the declared range: a LibreOffice sheet declares a million rows.
        for (r, c), ca in sorted(sa._cells.items()):
            if ours is not None and c >= ours:
                if ca.value is None:
                    continue  # an empty styled cell an added cell replaced
                problems.append(f"{name}!{ca.coordinate}: a value where the added columns are")
            cb = sb._cells.get((r, c))
            for what in ("value", "data_type", "number_format"):
                va = plain(getattr(ca, what))
                vb = plain(getattr(cb, what)) if cb is not None else {"value": None, "data_type": "n", "number_format": "General"}[what]
                if va != vb:
                    problems.append(f"{name}!{ca.coordinate} {what}: {va!r} became {vb!r}")
        if sorted(map(str, sa.merged_cells.ranges)) != sorted(map(str, sb.merged_cells.ranges)):
            problems.append(f"{name}: merged ranges changed")
        if len(sa.data_validations.dataValidation) != len(sb.data_validations.dataValidation):
            problems.append(f"{name}: data validations changed")
        if sa.freeze_panes != sb.freeze_panes:
            problems.append(f"{name}: frozen panes {sa.freeze_panes} became {sb.freeze_panes}")
        for letter, dim in sa.column_dimensions.items():
            if ours is not None and openpyxl.utils.column_index_from_string(letter) >= ours:
                continue
            if sb.column_dimensions[letter].width != dim.width:
                problems.append(f"{name}: width of column {letter} changed")
    return problems


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        pairs = json.load(f)
    failed = 0
    for pair in pairs:
        try:
            problems = compare(pair)
        except Exception as e:  # a workbook openpyxl cannot open is a finding, not a crash
            problems = [f"cannot compare: {type(e).__name__}: {e}"]
        if problems:
            failed += 1
            print(f"FAIL {pair['name']}: {len(problems)} differences")
            for p in problems[:10]:
                print("   ", p)
        else:
            print(f"ok   {pair['name']}")
    print(f"{len(pairs) - failed} of {len(pairs)} workbooks kept every original cell")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
