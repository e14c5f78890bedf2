"""How far the settings travel: infer's one frozen `InferSettings`, followed from `infer.run`.

A *stop* is a call of a package function that receives the settings object itself as an
argument (a profiler sees every call's arguments at entry; the settings' own properties, which
read it, are not stops, and a generator resumed is not a new call). A module is *entered* by a
stop called from a stop in another module (the first stop enters its own). A pipeline's hub
hands the settings to each stage and the stages do not call back into the hub, so the walk is
short and each module is entered once or twice; a hub that resolves, rebinds and re-reads
settings everywhere makes a long walk that keeps coming back.

The walk of infer's run (a speculative run on the task's references, so every stage runs:
read, encode, models, choice, decode in chunks, score, write) is printed by
`pytest -s -n 0 -k walk tests/runs/test_infer.py`.
"""

import collections
import inspect
import os
import sys

from speculative.runs import infer

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(infer.__file__)))


def settings_walk(settings, fn, root=PACKAGE):
    """Runs `fn()`; returns the stops, in call order: (module path, function, the module of the
    nearest stop it was called from, or None) of each call of a function under `root` whose
    arguments include `settings` (the object, by identity)."""
    stops, seen, module_of = [], set(), {}

    def profile(frame, event, arg):
        del arg
        if event != "call" or frame in seen:  # a generator resumed is the same call
            return
        seen.add(frame)
        path = frame.f_code.co_filename
        if not path.startswith(root):
            return
        args = inspect.getargvalues(frame)
        values = [args.locals[name] for name in args.args]
        values += list(args.locals.get(args.varargs, ()))
        values += list(args.locals.get(args.keywords, {}).values())
        # The settings' own methods (properties) read it; they are not stops on the way.
        if args.args and args.args[0] == "self" and values[0] is settings:
            return
        if any(value is settings for value in values):
            caller = frame.f_back
            while caller is not None and caller not in module_of:
                caller = caller.f_back
            module_of[frame] = os.path.relpath(path, root)
            stops.append((module_of[frame], frame.f_code.co_qualname,
                          None if caller is None else module_of[caller]))

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return stops


def module_entries(stops):
    """How many times the walk enters each module: stops called from another module's stop."""
    return collections.Counter(module for module, _, caller in stops if caller != module)
