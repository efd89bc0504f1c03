from rocm_audit.cli import entry

entry()
