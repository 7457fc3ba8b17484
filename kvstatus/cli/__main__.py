from kvstatus.cli import main

main(prog_name="kvstatus")
