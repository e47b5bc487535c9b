# A demo Code Mode block: call tools, fan out tool calls on threads, write a file.
from concurrent.futures import ThreadPoolExecutor

from tools import add, echo, list_files, save_file
from tools.weather import get_forecast

print(echo(message="hello from the sandbox"))
print("2 + 40 =", add(a=2, b=40))

cities = ["Paris", "Tokyo", "Lima", "Oslo"]
with ThreadPoolExecutor(max_workers=len(cities)) as pool:
    forecasts = list(pool.map(lambda c: get_forecast(city=c), cities))
lines = [f"{f['city']}: {f['summary']}, high {f['high_c']} C" for f in forecasts]
print("\n".join(lines))

with open("forecast.txt", "w") as fh:
    fh.write("\n".join(lines) + "\n")
save_file(filename="forecast.txt", content="\n".join(lines))
print("saved:", list_files())
