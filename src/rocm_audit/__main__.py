from rocm_audit.cli.app import entry

entry()
