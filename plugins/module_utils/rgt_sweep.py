# -*- coding: utf-8 -*-
# Copyright: rgt contributors
# SPDX-License-Identifier: Apache-2.0
"""Sweeps: a job's cells, their run ids, their commands and environments, and their placement over hosts
(docs/internals.md "Sweeps"). Pure and stdlib, so the runner and the box use the same rules.

A job spec may declare

    sweep:
      matrix: {lr: [1e-3, 3e-4], seed: [0, 1, 2]}     # every combination, keys in the order written
      cells: [{params: {lr: 1e-4, seed: 7}, args: "--warmup 0", env: {X: "1"}}]   # more cells, each explicit
      args: "--lr {lr} --seed {seed}"                  # appended to the job's command, {key} filled, shell-quoted
      env: {LR: "{lr}"}                                # per cell, {key} filled
      gpus_per_cell: 1

Each cell is a run of its own: run id `<name>--lr=3e-4--seed=1` (the params in matrix order, then the others
sorted), stable across re-runs and path-safe (the run id name rule). A value must read as letters, digits, '.',
'_' and '-' (not containing '--', not ending in '-'), so two different cells never share an id.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re
import string
from shlex import quote

from ansible_collections.rgt.remote_gpu.plugins.module_utils import rgt_runlayout

ROSTER_SCHEMA = "rgt/roster/v1"
# At most this many cells in one sweep (matrix combinations plus listed cells, docs/job-spec.md "Sweeps"): each is a
# run of its own (run dir, roster entry, job.json, queue slot), and the count is checked before any is built.
MAX_CELLS = 1000
SEP = "--"
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_VALUE = re.compile(r"[A-Za-z0-9._-]+\Z")


class SweepError(ValueError):
    """A sweep the rules refuse: `field` is the job-spec path (rgt_job.sweep...), `fix` what to do."""

    def __init__(self, field, message, fix):
        ValueError.__init__(self, message)
        self.field = field
        self.fix = fix


def value_text(value, field):
    """How a param value reads in a run id and in a command: ints as written, floats shortest (0.0003), booleans
    true/false, strings as written (YAML keeps `3e-4` a string)."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, int):
        text = str(value)
    elif isinstance(value, float):
        text = repr(value)
    elif isinstance(value, str):
        text = value
    else:
        raise SweepError(field, "%s: a sweep value must be a string, a number or a boolean, got %s"
                         % (field, type(value).__name__), "write a plain value such as 3e-4, 0.001, 7 or adamw")
    if not _VALUE.match(text) or SEP in text or text.endswith("-"):
        raise SweepError(field, "%s: the value %r cannot be part of a run id" % (field, text),
                         "use letters, digits, '.', '_' and '-' (no '--', not ending in '-'), e.g. 3e-4 or adamw")
    return text


def _check_key(key, field):
    if not isinstance(key, str) or not _KEY.match(key):
        raise SweepError(field, "%s: the sweep key %r is not a name" % (field, key),
                         "use letters, digits and '_', not starting with a digit (e.g. lr, seed, warmup_steps)")


def _fill(template, params, field, quoted):
    """`template` with every {key} replaced by the cell's value ({{ and }} are literal braces)."""
    out = []
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise SweepError(field, "%s: %s in %r" % (field, exc, template), "write {key} for a value, {{ or }} for "
                         "a literal brace") from None
    for literal, name, spec, conversion in parts:
        out.append(literal)
        if name is None:
            continue
        if name not in params or spec or conversion:
            known = ", ".join("{%s}" % k for k in params) or "none"
            raise SweepError(field, "%s: {%s} is not a param of this cell" % (field, name + (
                ("!" + conversion) if conversion else "") + ((":" + spec) if spec else "")),
                "use one of: %s" % known)
        text = params[name]
        out.append(quote(text) if quoted else text)
    return "".join(out)


def cells(job):
    """The cells of a job's sweep, in order: [{"id", "params" {key: text}, "args", "env"}]; [] without a sweep.
    Raises SweepError naming the field."""
    sweep = job.get("sweep")
    if not sweep:
        return []
    name = job.get("run_id") or job.get("name")
    matrix = sweep.get("matrix") or {}
    for key, values in matrix.items():
        _check_key(key, "rgt_job.sweep.matrix")
        if not isinstance(values, list) or not values:
            raise SweepError("rgt_job.sweep.matrix.%s" % key, "rgt_job.sweep.matrix.%s must be a non-empty list"
                             % key, "list the values, e.g. %s: [1e-3, 3e-4]" % key)
    listed = sweep.get("cells") or []
    combinations = 1
    for values in matrix.values():
        combinations *= len(values)
    count = (combinations if matrix else 0) + (len(listed) if isinstance(listed, list) else 0)
    if count > MAX_CELLS:
        sizes = " x ".join(str(len(v)) for v in matrix.values())
        raise SweepError("rgt_job.sweep", "rgt_job.sweep has %d cells (%s%s%d listed), over the cap of %d cells per "
                         "sweep: nothing was planned" % (count, "matrix %s = %d, " % (sizes, combinations)
                                                         if matrix else "", "plus " if matrix else "", len(listed),
                                                         MAX_CELLS),
                         "split it into sweeps of at most %d cells (each its own rgt_job.name), or trim the matrix"
                         % MAX_CELLS)
    order = list(matrix)
    combos = [[]]
    for key in order:
        combos = [done + [(key, value_text(v, "rgt_job.sweep.matrix.%s[%d]" % (key, i)))]
                  for done in combos for i, v in enumerate(matrix[key])]
    specs = [(dict(combo), "", {}, "rgt_job.sweep.matrix") for combo in combos if combo]
    for index, cell in enumerate(listed):
        field = "rgt_job.sweep.cells[%d]" % index
        params = {}
        for key, value in (cell.get("params") or {}).items():
            _check_key(key, field + ".params")
            params[key] = value_text(value, "%s.params.%s" % (field, key))
        if not params:
            raise SweepError(field + ".params", "%s has no params: a cell is named by them" % field,
                             "give the cell's params, e.g. params: {lr: 1e-4, seed: 7}")
        specs.append((params, cell.get("args") or "", cell.get("env") or {}, field))
    out = []
    seen = {}
    for params, own_args, own_env, field in specs:
        keys = [k for k in order if k in params] + sorted(k for k in params if k not in order)
        run_id = SEP.join([name] + ["%s=%s" % (k, params[k]) for k in keys])
        if run_id in seen:
            raise SweepError(field, "%s is the same cell as %s (%s)" % (field, seen[run_id], run_id),
                             "remove one of them, or give them different params")
        seen[run_id] = field
        problem = rgt_runlayout.check_name(run_id, "run id")
        if problem:
            raise SweepError(field, "%s: the cell's run id is refused: %s" % (field, problem),
                             "shorten rgt_job.name or the values (a run id holds at most %d characters)"
                             % rgt_runlayout.NAME_MAX)
        args = " ".join(a for a in (_fill(sweep.get("args") or "", params, "rgt_job.sweep.args", True),
                                    _fill(own_args, params, field + ".args", True)) if a)
        env = {}
        for source, where in ((sweep.get("env") or {}, "rgt_job.sweep.env"), (own_env, field + ".env")):
            for var, template in source.items():
                problem = rgt_runlayout.check_env_name(var)
                if problem:
                    raise SweepError("%s.%s" % (where, var), "%s: %s" % (where, problem), "rename the variable")
                env[var] = _fill(str(template), params, "%s.%s" % (where, var), False)
        out.append({"id": run_id, "params": dict((k, params[k]) for k in keys), "args": args, "env": env})
    return out


def cell_command(command, cell):
    """The job's command for one cell: the command as written, then the cell's args (already shell-quoted)."""
    return command if not cell["args"] else "%s %s" % (command.rstrip(), cell["args"])


def cell_job(job, cell):
    """A cell as an ordinary run's job spec (the runner's memory of it, the launch's job.json): the sweep's job
    without `sweep`, the cell's run id and command (`cell["command"]`, cell_command's), the job's env with the
    cell's over it."""
    out = dict((k, v) for k, v in job.items() if k != "sweep")
    env = dict(job.get("env") or {})
    env.update(cell.get("env") or {})
    out.update(run_id=cell["id"], command=cell["command"], env=env)
    return out


def place(cell_ids, hosts, weights=None, placed=None):
    """{host: [cell id, ...]} over `hosts` (inventory order): each cell goes to the host with the fewest cells per
    weight (the cells it runs at once; default 1), the first such host on a tie, counting the cells `placed`
    already holds (a roster's kept cells). Deterministic: the same cells and hosts give the same placement."""
    weights = weights or {}
    placed = dict((h, list((placed or {}).get(h) or [])) for h in hosts)
    for cell_id in cell_ids:
        host = min(hosts, key=lambda h: (len(placed[h]) / float(max(1, weights.get(h, 1))), hosts.index(h)))
        placed[host].append(cell_id)
    return placed


def roster(name, job_cells, placement, created_at=None):
    """The sweep's roster: exactly the cells expected, per host and overall (written on each box and in the
    ledger; status reconciles against it)."""
    by_id = dict((c["id"], c) for c in job_cells)
    return {"schema": ROSTER_SCHEMA, "sweep": name, "created_at": created_at,
            "cells": [dict(by_id[i], host=h) for h in placement for i in placement[h]],
            "hosts": dict((h, list(ids)) for h, ids in placement.items())}



def box_roster(params):
    """A sweep's roster as this box keeps it (<durable_root>/<project>/sweeps/<sweep>/roster.json, written by the
    launch), read-only: {"cells": {cell id: host}, "created_at"}, or None when the box has none (or an unreadable
    one). The runner reads it before it places the cells of a sweep whose roster the ledger lost: the box's roster
    wins over a new placement. Raises ValueError for a project or sweep that is not a plain name."""
    layout = rgt_runlayout.RunPaths(rgt_runlayout.expand_root(params["durable_root"]), params["project"],
                                    params["sweep"])  # ValueError: not plain names
    doc = rgt_runlayout.read_json(os.path.join(layout.sweep_dir(params["sweep"]), "roster.json"))
    if not isinstance(doc, dict) or not isinstance(doc.get("cells"), list):
        return None
    cells = dict((c.get("id"), c.get("host")) for c in doc["cells"]
                 if isinstance(c, dict) and isinstance(c.get("id"), str) and isinstance(c.get("host"), str))
    return {"cells": cells, "created_at": doc.get("created_at")}
