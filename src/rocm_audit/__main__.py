from rocm_audit.cli import main

raise SystemExit(main())
