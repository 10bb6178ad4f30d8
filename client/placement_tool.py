"""`cairn placement test`: placement of a pool on a map file, offline (no cluster needed).

Prints each OSD's PG count against its weight share and, given a second map (`--compare`), the
PGs whose OSDs change between the two maps: the data a map change would move.
"""

import json
import sys

from cairn.common.placement import PlacementError, PlacementMap

MOVES_SHOWN_MAX = 10


def load_map(path):
    try:
        with open(path) as handle:
            data = json.load(handle)
    except OSError as exc:
        raise PlacementError(f"cannot read {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise PlacementError(f"{path} is not JSON: {exc}") from None
    try:
        return PlacementMap.from_dict(data)
    except PlacementError as exc:
        raise PlacementError(f"{path}: {exc}") from None


def distribution(pmap, pool_name):
    """Per-OSD PG counts of a pool against their weight share."""
    pool = pmap.pool(pool_name)
    results = pmap.map_pool(pool_name)
    placed = {}
    for members in results:
        for osd_id in members:
            if osd_id is not None:
                placed[osd_id] = placed.get(osd_id, 0) + 1
    effective = {osd.id: osd.weight * osd.reweight if osd.is_in else 0
                 for osd in pmap.osds.values()}
    total_weight = sum(effective.values()) or 1
    slots = sum(1 for members in results for osd_id in members if osd_id is not None)
    rows = []
    for osd_id in sorted(pmap.osds):
        expected = slots * effective[osd_id] / total_weight
        actual = placed.get(osd_id, 0)
        rows.append({"id": osd_id, "host": pmap.ancestor(f"osd.{osd_id}", "host"),
                     "weight": pmap.osds[osd_id].weight / 0x10000,
                     "reweight": pmap.osds[osd_id].reweight / 0x10000,
                     "in": pmap.osds[osd_id].is_in, "pgs": actual,
                     "expected": round(expected, 1),
                     "deviation": round((actual - expected) / expected, 4) if expected else None})
    deviations = [abs(row["deviation"]) for row in rows if row["deviation"] is not None]
    short = sum(1 for members in results
                if sum(osd_id is not None for osd_id in members) < pool.size)
    return results, {"pool": pool.name, "pg_num": pool.pg_num, "size": pool.size,
                     "rule": pool.rule, "osds": rows,
                     "max_deviation": round(max(deviations), 4) if deviations else None,
                     "short_pgs": short}


def moves(pool, before, after):
    changed = [(index, old, new) for index, (old, new) in enumerate(zip(before, after))
               if old != new]
    copies = sum(len({o for o in new if o is not None} - {o for o in old if o is not None})
                 for _, old, new in changed)
    return {"pgs_changed": len(changed), "fraction": round(len(changed) / pool.pg_num, 4),
            "copies_moved": copies,
            "examples": [{"pg": f"{pool.id}.{index:x}", "from": old, "to": new}
                         for index, old, new in changed[:MOVES_SHOWN_MAX]]}


def run(args):
    pmap = load_map(args.map)
    pmap.check_pool(args.pool)
    results, report = distribution(pmap, args.pool)
    if args.compare:
        other = load_map(args.compare)
        other_results = other.map_pool(args.pool)
        report["moved"] = moves(pmap.pool(args.pool), results, other_results)
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"pool {report['pool']}: {report['pg_num']} PGs x {report['size']} "
          f"(rule {report['rule']})")
    print(f"{'osd':>6} {'host':<12} {'weight':>7} {'pgs':>7} {'expected':>9} {'dev':>7}")
    for row in report["osds"]:
        deviation = "-" if row["deviation"] is None else f"{row['deviation'] * 100:+.1f}%"
        note = "" if row["in"] else "  (out)"
        print(f"{row['id']:>6} {row['host'] or '-':<12} {row['weight']:>7.3f} {row['pgs']:>7} "
              f"{row['expected']:>9.1f} {deviation:>7}{note}")
    if report["max_deviation"] is not None:
        print(f"largest deviation from the weight share: {report['max_deviation'] * 100:.1f}%")
    if report["short_pgs"]:
        print(f"{report['short_pgs']} PGs have fewer than {report['size']} OSDs")
    if "moved" in report:
        moved = report["moved"]
        print(f"against {args.compare}: {moved['pgs_changed']} PGs change "
              f"({moved['fraction'] * 100:.1f}%), {moved['copies_moved']} PG copies move")
        for example in moved["examples"]:
            print(f"  pg {example['pg']}: {example['from']} -> {example['to']}")
    return 0


def add_parser(commands):
    placement = commands.add_parser("placement", help="offline placement tools")
    tools = placement.add_subparsers(dest="tool", required=True, metavar="TOOL")
    test = tools.add_parser("test", help="PG counts per OSD against weight share; with "
                                         "--compare, the PGs that move between two maps")
    test.add_argument("--map", required=True, help="placement map (JSON)")
    test.add_argument("--pool", required=True)
    test.add_argument("--compare", metavar="MAP", help="a second map: show what moves")
    test.add_argument("--json", action="store_true", help="print one JSON object")


def main(args):
    try:
        return run(args)
    except PlacementError as exc:
        print(f"cairn placement: {exc}", file=sys.stderr)
        return 2
