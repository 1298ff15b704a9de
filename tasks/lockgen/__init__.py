"""The maintainers' lock authoring, outside the installed package: pixi.lock and envs/ solved offline
from the record store (envs/records/). Run through tasks/lock.py (`pixi run lock`) and
tasks/import_records.py; `gptforge lock check` verifies what they write.

    solve     the conda part: pixi's solver (resolvo, through py-rattler) over the record store
    pypi      the PyPI part: uv's resolution, the registry's sha256 and wheel metadata
    build     all of it, in order, then pixi.lock and the exports
    records   filling the record store from public pixi.lock files
    sizes     each environment's download size, from the lock
    cli       the command line of tasks/lock.py and tasks/import_records.py
"""
