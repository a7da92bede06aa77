from .faces.cli import main

raise SystemExit(main())
