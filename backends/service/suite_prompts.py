"""The prompts of ``specdeck-bench --suite``: code writing, a code rewrite, prose, a long summary.

They span where speculation pays and where it does not: a rewrite copies most of its
prompt (lookups draft it for free), fresh code is predictable for a small draft model,
prose is not, and a long context makes every forward pass dearer.
"""

from __future__ import annotations

from dataclasses import dataclass

_INVENTORY_MODULE = """\
import json
from dataclasses import dataclass, field


@dataclass
class Item:
    name: str
    quantity: int = 0
    tags: list = field(default_factory=list)


def load_items(path):
    with open(path, encoding="utf-8") as handle:
        raw = json.load(handle)
    return [Item(entry["name"], entry.get("quantity", 0), entry.get("tags", [])) for entry in raw]


def total_quantity(items):
    return sum(item.quantity for item in items)


def items_with_tag(items, tag):
    return [item for item in items if tag in item.tags]


def restock(items, minimum, amount):
    changed = []
    for item in items:
        if item.quantity < minimum:
            item.quantity += amount
            changed.append(item.name)
    return changed


def save_items(items, path):
    data = [{"name": i.name, "quantity": i.quantity, "tags": i.tags} for i in items]
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2)
"""

_HARBOUR_REPORT = """\
The harbour authority of Brindlemouth met on the third of March to review the winter
season and to plan the works for the coming year. The meeting opened with the report of
the harbour master, who described a winter that was stormier than any of the previous
ten. Eleven gales were recorded between November and February, three of them strong
enough to close the outer channel for more than a day. During the worst of them, on the
night of the fourteenth of January, the swell overtopped the north breakwater for almost
four hours and carried away a section of the parapet about twenty metres long. No vessel
was damaged, because the fishing fleet had been moved to the inner basin the evening
before, but the harbour master warned that the breakwater would not survive another
winter like this one without repair.

The engineer's survey, presented next, confirmed the warning. Divers found that the toe
of the breakwater had been scoured along most of its length, and that several of the
large armour blocks on the seaward face had shifted. The engineer proposed two options.
The first was to replace the lost parapet and to place new rock at the toe, which would
cost about four hundred thousand and could be finished before the autumn. The second was
to raise the whole crest of the breakwater by one metre and to add a second layer of
armour, which would cost nearly two million and take two summers. The engineer said that
the first option would restore the breakwater to its old condition, but that the old
condition had been designed for the storms of fifty years ago, and that the records of
the last decade showed both higher waves and higher tides.

The treasurer then reported on the accounts. Income from mooring fees had fallen by
eight percent, mostly because two of the larger trawlers had moved to a neighbouring
port with a deeper berth. Income from the fish market had risen slightly, thanks to a
good season for crab and lobster. The authority held reserves of about six hundred
thousand, enough for the first option but not the second. The treasurer pointed out that
a regional fund for coastal resilience was accepting applications until the end of June
and might pay up to seventy percent of the second option, but that the application
required a full environmental assessment, which would take at least three months.

A long discussion followed. The representative of the fishermen's cooperative argued for
the first option, saying that the fleet could not afford to lose the harbour for two
summers and that the repairs were needed before next winter whatever else was decided.
The representative of the town council argued for the second option, saying that patching
the breakwater every few years would cost more in the long run and that the regional fund
was an opportunity that might not come again. The harbour master suggested combining the
two: repair the parapet and the toe this summer from reserves, and apply to the regional
fund for raising the crest in the following years, designing the repairs so that they
would form part of the larger works.

The members also discussed the dredging of the inner basin, which had not been done for
six years. Silt had built up along the east quay, and at low spring tides the larger
boats could no longer lie afloat there. The engineer estimated the dredging at ninety
thousand and recommended doing it in September, after the tourist season and before the
autumn gales. The cooperative asked that the dredged material be tested before disposal,
because of old industrial waste known to lie under the east quay.

Finally, the meeting heard a proposal from a local sailing club to lease the disused
slipway on the south side for a small boat park and training centre. The club offered a
modest rent and promised to repair the slipway at its own cost. Several members welcomed
the idea as a way to bring young people to the harbour, but the harbour master asked that
the lease include a clause allowing the authority to use the slipway in emergencies.

The chair closed the meeting by asking the engineer to prepare a combined plan along the
lines suggested by the harbour master, the treasurer to start the application to the
regional fund, and the secretary to draft terms for the sailing club's lease. The next
meeting was set for the fifth of May.
"""


@dataclass(frozen=True)
class SuitePrompt:
    """One prompt of the suite and how many tokens to generate for it."""

    key: str
    title: str
    text: str
    max_tokens: int


SUITE_PROMPTS: tuple[SuitePrompt, ...] = (
    SuitePrompt("quicksort", "write code", "Write a quicksort function in Python.", 128),
    SuitePrompt(
        "type-hints",
        "rewrite code",
        "Add type hints to this Python code and return the whole file.\n\n```python\n"
        + _INVENTORY_MODULE
        + "```",
        256,
    ),
    SuitePrompt(
        "prose",
        "prose",
        "Write a short story about a lighthouse keeper who finds a message in a bottle.",
        128,
    ),
    SuitePrompt(
        "summary",
        "long-context summary",
        "Summarise the following meeting report in one paragraph, then list the decisions "
        "taken.\n\n" + _HARBOUR_REPORT,
        128,
    ),
)
