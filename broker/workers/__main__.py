"""``python -m broker.workers``: one worker process (started by ``broker serve --workers``)."""

from ._worker import main

raise SystemExit(main())
