from stare.app.report import main

main()
