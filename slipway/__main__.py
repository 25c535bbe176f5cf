from slipway.cli import main

raise SystemExit(main())
